"""Router-side image identity ↔ engine-side identifier: which identifier an engine gave each
image mmlens sent, learned from the image blocks the serving worker stored for it.

mmlens names an image as SMG does (the blake3 of its bytes); an engine names it by the
identifier it was given or computed (vLLM's ``extra_keys``: SMG's hash in router mode, its own
in worker mode). A one-image request whose worker stored image blocks under exactly one new
identifier while serving it (and nobody else was served there then) ties the two together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mmlens.analysis.affinity import image_key
from mmlens.analysis.block_labels import Serving
from mmlens.analysis.views.common import worker_label
from mmlens.records import KVEventRow, RequestTrace


@dataclass(slots=True)
class IdentityLink:
    router_id: str  # mmlens' (SMG's) identity of the image
    size: str
    engine_ids: dict[str, set[str]] = field(default_factory=dict)  # engine id → workers
    router_keyed: set[str] = field(default_factory=set)  # engine ids = the router's own
    requests: list[str] = field(default_factory=list)  # the requests it was learned from


def identity_links(events: Iterable[KVEventRow], traces: Sequence[RequestTrace],
                   ) -> list[IdentityLink]:
    """One link per router-side identity whose engine identifier was learned."""
    by_request: dict[str, set[str]] = {}
    owners: dict[str, RequestTrace] = {}
    serving = Serving(traces)
    for ev in events:
        if ev.kind != "stored" or not ev.images:
            continue
        t = serving.owner(ev)
        if t is not None and len(t.images) == 1:
            by_request.setdefault(t.request_id, set()).update(ev.images)
            owners[t.request_id] = t
    links: dict[str, IdentityLink] = {}
    for rid, engine_ids in by_request.items():
        t = owners[rid]
        im = t.images[0]
        key = image_key(im)
        if key is None or len(engine_ids) != 1 or t.worker is None:
            continue
        (engine_id,) = engine_ids
        link = links.setdefault(key, IdentityLink(
            key, f"{im.width}x{im.height}" if im.width else "?"))
        link.engine_ids.setdefault(engine_id, set()).add(t.worker)
        if engine_id in router_names(t):
            link.router_keyed.add(engine_id)
        link.requests.append(rid)
    return sorted(links.values(), key=lambda x: (-len(x.requests), x.router_id))


def router_names(t: RequestTrace) -> set[str]:
    """Every name mmlens computed for a request's image as a router would send it (the bytes'
    blake3, SMG's re-keyed identity, Dynamo's URL hash)."""
    names = {str(v) for v in t.images[0].identities.values() if v} if t.images else set()
    lay = t.expected_layout
    if lay is not None and lay.images:
        names |= {str(v) for v in lay.images[0].identity.values() if isinstance(v, str)}
    return names


def identity_rows(links: Sequence[IdentityLink], names: Mapping[str, str] | None = None,
                  ) -> list[dict[str, object]]:
    """The Affinity page's mapping table."""
    rows = []
    for link in links:
        for engine_id, workers in sorted(link.engine_ids.items()):
            same = engine_id in link.router_keyed
            rows.append({
                "image (router side)": link.router_id[:16], "size": link.size,
                "engine identifier": engine_id[:16],
                "on workers": ", ".join(sorted(worker_label(w, names) for w in workers)),
                "engine keyed it by": "the router's identity (router mode)" if same else
                "its own identifier (worker mode or another hash)",
                "learned from": link.requests[-1]})
    return rows
