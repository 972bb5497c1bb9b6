"""flexinfer_cli: the `flexinfer` command. Thin: parses, calls the packages, prints."""
