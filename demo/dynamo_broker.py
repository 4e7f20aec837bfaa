"""A loopback ZMQ XSUB/XPUB relay for Dynamo's event plane in broker mode.

Dynamo's direct ZMQ mode binds every publisher to all interfaces; broker mode makes publishers
connect to this relay instead, so every listener stays on 127.0.0.1.

Run: python -m mmlens.demo.dynamo_broker --xsub-port P --xpub-port Q
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence

import zmq

HOST = "127.0.0.1"


def broker_url(xsub_port: int, xpub_port: int) -> str:
    """The `DYN_ZMQ_BROKER_URL` value that points Dynamo at this relay."""
    return f"xsub=tcp://{HOST}:{xsub_port} , xpub=tcp://{HOST}:{xpub_port}"


def serve(xsub_port: int, xpub_port: int) -> None:
    ctx = zmq.Context()
    xsub = ctx.socket(zmq.XSUB)
    xpub = ctx.socket(zmq.XPUB)
    for sock in (xsub, xpub):
        sock.setsockopt(zmq.LINGER, 0)
    xsub.bind(f"tcp://{HOST}:{xsub_port}")
    xpub.bind(f"tcp://{HOST}:{xpub_port}")
    print(json.dumps({"event": "broker_ready", "xsub": xsub_port, "xpub": xpub_port}),
          flush=True)
    try:
        zmq.proxy(xsub, xpub)
    except (zmq.ContextTerminated, KeyboardInterrupt):
        pass
    finally:
        xsub.close(0)
        xpub.close(0)
        ctx.term()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mmlens.demo.dynamo_broker", description=__doc__)
    p.add_argument("--xsub-port", type=int, required=True)
    p.add_argument("--xpub-port", type=int, required=True)
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    serve(args.xsub_port, args.xpub_port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
