"""Collectors: thin I/O adapters feeding typed records to the store, each on an injected client."""
