"""lnk_ssh_gate: `lnk sandbox enter`, the forced command of a box user's SSH key."""
