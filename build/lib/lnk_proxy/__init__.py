"""lnk_proxy: the filtering proxy, every sandbox's one way out."""
