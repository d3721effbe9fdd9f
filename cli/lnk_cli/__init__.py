"""lnk_cli: the `lnk` command, a thin unprivileged client (root's `lnk box ...` is lnk_admin's)."""
