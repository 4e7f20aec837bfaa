"""Every `mmlens` command: argument parsing and dispatch; the layer that wires I/O to the core."""

from mmlens.cli.main import main

__all__ = ["main"]
