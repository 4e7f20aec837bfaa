"""Analysis on typed records: explanations, request and routing views, affinity, scenarios."""
