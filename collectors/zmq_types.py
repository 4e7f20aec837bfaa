"""pyzmq's generic socket and context types as the KV collectors use them (bytes frames)."""

from __future__ import annotations

from typing import TypeAlias

import zmq

ZmqSocket: TypeAlias = "zmq.Socket[bytes]"
ZmqContext: TypeAlias = "zmq.Context[zmq.Socket[bytes]]"
