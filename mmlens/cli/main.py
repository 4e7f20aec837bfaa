"""The `mmlens` command: each subcommand lives in its own module and is imported on use.

Commands are imported inside their dispatch functions so that one command's heavy imports
(grpc, streamlit, the demo cluster) cost nothing to the others; the imports stay explicit so
the import graph (and tests/test_layering.py) sees every dependency.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

Command = Callable[[list[str]], int | None]


def _layout(argv: list[str]) -> int | None:
    from mmlens.cli import layout

    return layout.main(argv)


def _demo(argv: list[str]) -> int | None:
    from mmlens.demo import cli

    return cli.main(argv)


def _dashboard(argv: list[str]) -> int | None:
    from mmlens.cli import dashboard

    return dashboard.main(argv)


def _collect(argv: list[str]) -> int | None:
    from mmlens.cli import collect

    return collect.main(argv)


def _snapshot(argv: list[str]) -> int | None:
    from mmlens.cli import snapshot

    return snapshot.main(argv)


def _check(argv: list[str]) -> int | None:
    from mmlens.cli import check

    return check.main(argv)


def _explain(argv: list[str]) -> int | None:
    from mmlens.cli import explain

    return explain.main(argv)


def _whatif(argv: list[str]) -> int | None:
    from mmlens.cli import whatif

    return whatif.main(argv)


def _tap(argv: list[str]) -> int | None:
    from mmlens.cli import tap

    return tap.main(argv)


def _replay(argv: list[str]) -> int | None:
    from mmlens.cli import replay

    return replay.main(argv)


COMMANDS: dict[str, tuple[Command, str]] = {
    "layout": (_layout, "token layout of a chat request for a model family"),
    "demo": (_demo, "run the embedded demo cluster (real router, simulated workers)"),
    "dashboard": (_dashboard, "serve the Streamlit dashboard on 127.0.0.1"),
    "collect": (_collect, "run all collectors headless into the store"),
    "snapshot": (_snapshot, "print the current normalized state of a store"),
    "check": (_check, "run routing scenarios against a live router"),
    "explain": (_explain, "explain why a recorded request missed the cache"),
    "whatif": (_whatif, "replay a recorded window through other routers, modes and caches"),
    "tap": (_tap, "proxy a router and record every request passing through"),
    "replay": (_replay, "re-send a recorded window to a live router with its timing"),
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
    return int(COMMANDS[name][0](rest) or 0)
