"""Models of the routing policies, each in its own module, with their parameters named as the
router's own flags and defaulted as the router defaults them (``PARAMS`` in each module)."""
