"""lnk_cli: the `lnk` command, a thin unprivileged client."""
