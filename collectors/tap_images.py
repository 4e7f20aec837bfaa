"""Images the tap fetches itself (``mmlens tap --fetch-images``).

An image sent by http(s) URL says nothing of its size or content until someone fetches it;
the worker does, the router may. With this on, the tap fetches each such image once the
response has gone back to the client (the client never waits for it), so the record gets
the image's dimensions, byte size and content identities (SMG's blake3, Dynamo's hashes) as
a data: URL's would, and the expected token layout can be computed. Only those facts are
stored, never the bytes.

Bounded: hosts outside ``allowed_hosts`` (when given) are not fetched; without an allow-list
no private, loopback, link-local or otherwise non-public address is (unless
``allow_private``), checked on the addresses the name resolves to, which are then the ones
connected to (resolved once: a name that re-resolves elsewhere — DNS rebinding — is not
asked again); redirects are not followed, only http and https; each fetch has a deadline and
a byte cap, and results are cached per URL for a short while under a total byte budget (a
demo sending one image a hundred times fetches it once). Every outcome is counted in the
tap's health.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from mmlens.layout.sent import SentImage, describe_image
from mmlens.records import CollectorHealth

MAX_IMAGE_BYTES = 20 << 20


class FetchRefused(Exception):
    """Why an image was not fetched (its message is the health error kind)."""


def host_allowed(url: str, allowed: frozenset[str] | None) -> bool:
    """``allowed`` holds ``host`` (any port) or ``host:port`` entries; None allows all."""
    if allowed is None:
        return True
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    return host in allowed or f"{host}:{port}" in allowed


def public_address(ip: str) -> bool:
    """Whether ``ip`` is a global unicast address (not private, loopback, link-local,
    multicast, reserved or unspecified; an IPv4-mapped IPv6 address as its IPv4)."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_global and not addr.is_multicast


class PublicResolver(AbstractResolver):
    """Resolves through the system resolver and keeps only public addresses: aiohttp then
    connects to exactly those, so the check and the connection use one resolution."""

    def __init__(self) -> None:
        self._inner = ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        kept = [r for r in found if public_address(r["host"])]
        if not kept:
            raise OSError(f"{host} resolves to no public address")
        return kept

    async def close(self) -> None:
        await self._inner.close()


def _literal_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def _own(sent: SentImage) -> SentImage:
    """A copy whose record fields a later merge may change without touching the cache."""
    return replace(sent, info=replace(sent.info, identities=dict(sent.info.identities)))


@dataclass
class _Cached:
    sent: SentImage
    size: int
    at: float


@dataclass
class ImageFetcher:
    health: CollectorHealth = field(default_factory=lambda: CollectorHealth("tap", "images"))
    allowed_hosts: frozenset[str] | None = None
    max_bytes: int = MAX_IMAGE_BYTES
    timeout_s: float = 5.0
    ttl_s: float = 60.0
    cache_bytes: int = 64 << 20
    allow_private: bool = False
    _cache: OrderedDict[str, _Cached] = field(default_factory=OrderedDict)
    _cached_bytes: int = 0

    def _checks_addresses(self) -> bool:
        """Hosts named in the allow-list may be private (the operator named them)."""
        return self.allowed_hosts is None and not self.allow_private

    def session(self) -> aiohttp.ClientSession:
        """The session fetches go through (on the loop that will use it)."""
        kwargs: dict[str, Any] = {"limit": 32, "ttl_dns_cache": 300}
        if self._checks_addresses():
            kwargs["resolver"] = PublicResolver()
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(**kwargs),
                                     trust_env=False)

    async def describe(self, session: aiohttp.ClientSession, url: str) -> SentImage | None:
        """The image behind ``url`` described as a sent image, or None (counted why)."""
        hit = self._cache.get(url)
        if hit is not None and time.monotonic() - hit.at < self.ttl_s:
            self._cache.move_to_end(url)
            self.health.count("image_fetch_cache_hits")
            return _own(hit.sent)
        try:
            data = await self._fetch(session, url)
        except FetchRefused as exc:
            self.health.error(str(exc), url.split("?", 1)[0][:200], time.time())
            return None
        sent = await asyncio.to_thread(describe_image, url, data)
        sent = replace(sent, info=replace(sent.info, url_kind="http"))
        self.health.count("images_fetched")
        self._remember(url, sent, len(data))
        return _own(sent)

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> bytes:
        if urlsplit(url).scheme not in ("http", "https"):
            raise FetchRefused("image_fetch_scheme")
        if not host_allowed(url, self.allowed_hosts):
            raise FetchRefused("image_fetch_host_not_allowed")
        host = urlsplit(url).hostname or ""
        if self._checks_addresses() and _literal_ip(host) and not public_address(host):
            raise FetchRefused("image_fetch_address_not_public")
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.get(url, allow_redirects=False) as resp:
                    if resp.status != 200:
                        raise FetchRefused(f"image_fetch_http_{resp.status}")
                    if (resp.content_length or 0) > self.max_bytes:
                        raise FetchRefused("image_fetch_too_large")
                    buf = bytearray()
                    async for chunk in resp.content.iter_any():
                        buf += chunk
                        if len(buf) > self.max_bytes:
                            raise FetchRefused("image_fetch_too_large")
                    return bytes(buf)
        except TimeoutError:
            raise FetchRefused("image_fetch_timeout") from None
        except aiohttp.ClientConnectorError as exc:
            if "no public address" in str(exc.os_error):
                raise FetchRefused("image_fetch_address_not_public") from None
            raise FetchRefused("image_fetch_failed") from None
        except (aiohttp.ClientError, OSError, ValueError):
            raise FetchRefused("image_fetch_failed") from None

    def _remember(self, url: str, sent: SentImage, size: int) -> None:
        if size > self.cache_bytes // 4:
            return
        old = self._cache.pop(url, None)
        if old is not None:
            self._cached_bytes -= old.size
        self._cache[url] = _Cached(sent, size, time.monotonic())
        self._cached_bytes += size
        while self._cached_bytes > self.cache_bytes and self._cache:
            _, dropped = self._cache.popitem(last=False)
            self._cached_bytes -= dropped.size
