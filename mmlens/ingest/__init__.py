"""Parsing and normalization of what routers and workers emit (metrics, KV events, logs, state)."""
