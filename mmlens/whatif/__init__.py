"""What if: recorded traffic replayed through models of other routers, modes, block sizes and
cache sizes (pure: no network, processes, Streamlit or SQL; the store builds the workload)."""
