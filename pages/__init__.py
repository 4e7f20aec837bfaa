"""The Streamlit pages (scripts run by app.py) and their shared helpers; rendering only."""
