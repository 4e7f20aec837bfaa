"""The `mmlens` command: each subcommand lives in its own module and is imported on use.

Subcommands are looked up by name so that a command's heavy imports (grpc, streamlit, the
demo cluster) cost nothing to the others.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "layout": ("mmlens.layout_cli", "token layout of a chat request for a model family"),
    "demo": ("demo.cli", "run the embedded demo cluster (real router, simulated workers)"),
    "dashboard": ("mmlens.dashboard_cli", "serve the Streamlit dashboard on 127.0.0.1"),
    "collect": ("collectors.cli", "run all collectors headless into the store"),
    "snapshot": ("collectors.snapshot_cli", "print the current normalized state of a store"),
    "check": ("collectors.check_cli", "run routing scenarios against a live router"),
    "explain": ("mmlens.explain_cli", "explain why a recorded request missed the cache"),
}


def usage() -> str:
    lines = ["usage: mmlens COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name in {"-V", "--version"}:
        from mmlens import __version__

        print(__version__)
        return 0
    if name not in COMMANDS:
        print(f"mmlens: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)
