"""The embedded demo cluster: real routers before simulated workers on the real wire protocols."""
