"""Per-page view models: the rows, series and texts each dashboard page lays out as widgets."""
