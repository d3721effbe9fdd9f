"""lnk_shared: what every lnk box service and the CLI agree on (specs, grants, errors, paths)."""
