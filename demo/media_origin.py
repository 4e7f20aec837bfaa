"""The demo's own media origin: a loopback image server started with the cluster, on a port of
the cluster's layout. The workers fetch image URLs from it and from nothing else unless asked
(`--media-host HOST:PORT`); mmlens uploads its test images to it (``PUT /media/<sha256>``) and
learns its URL from the ready line (``media_origin``).

It listens on a loopback address of its own, ``ORIGIN_HOST``, where nothing else of the demo
listens (every other server binds 127.0.0.1). A router that fetches images itself (the
router-mode SMG) matches its allow-list by host alone, so this is what keeps it from the demo's
other ports: ``127.0.0.1`` is not on its list, and on ``ORIGIN_HOST`` no other port answers."""

from __future__ import annotations

import re

from mmlens.collectors.media_server import MediaServer
from mmlens.demo.procs import ClusterError

MEDIA_PORT_OFFSET = 7  # port_base + 7, in both clusters' layouts
ORIGIN_HOST = "127.0.0.7"  # loopback (127.0.0.0/8), bound by the media origin alone
_HOST_PORT = re.compile(r"^(?P<host>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5}|\*)$")


def media_host(entry: str) -> str:
    """``HOST:PORT`` (or ``HOST:*``, every port of the host, by explicit choice) as the
    workers' allow-list takes it; ValueError with the reason otherwise."""
    m = _HOST_PORT.match(entry.strip())
    if not m:
        raise ValueError(f"media host {entry[:80]!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    port = m.group("port")
    if port != "*" and not 1 <= int(port) <= 65535:
        raise ValueError(f"media host {entry[:80]!r}: port out of range 1..65535")
    # The workers compare against the URL's hostname: lower case, IPv6 without brackets.
    return f"{m.group('host').strip('[]').lower()}:{port}"


def allow_list(origin_port: int, extra: list[str]) -> list[str]:
    """What the workers may fetch from: the demo's origin, then the extra hosts asked for."""
    own = f"{ORIGIN_HOST}:{origin_port}"
    return [own, *(h for h in (media_host(e) for e in extra) if h != own)]


def origin_url(port: int) -> str:
    return f"http://{ORIGIN_HOST}:{port}"


def start_origin(port: int) -> MediaServer:
    """The demo's media server on ``ORIGIN_HOST:port``, accepting uploads; ClusterError when
    the port is taken."""
    try:
        server = MediaServer(ORIGIN_HOST, port, uploads=True)
    except OSError as exc:
        raise ClusterError(f"media origin port {port}: {exc} (choose another --port-base)"
                           ) from None
    return server.__enter__()
