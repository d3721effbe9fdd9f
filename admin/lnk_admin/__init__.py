"""lnk_admin: root's one-shot admin commands (`lnk box up|down|status|prune|authorize`), run
through the one `lnk` command, whose parser hands `lnk box ...` to this package."""
