"""lnk_bridge_store: the store bridge and the way-in bridge for agents."""
