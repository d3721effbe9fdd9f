"""lnk_controller: the only privileged service (sandbox lifecycle, remembered specs)."""
