"""Plotly figure builders and the self-contained HTML report: pure functions of analysis records."""
