"""The `taurl` command line."""
