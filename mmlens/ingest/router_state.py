"""Router admin JSON (SMG ``/workers``, ``/get_loads``) → RouterWorker / WorkerLoad records."""

from __future__ import annotations

from typing import Any

from mmlens.ingest.numbers import as_float, as_int
from mmlens.records import RouterWorker, WorkerLoad

_int = as_int


def _float(v: Any, default: float | None = 0.0) -> float | None:
    f = as_float(v)
    return default if f is None else f


def parse_smg_workers(doc: Any) -> list[RouterWorker]:
    """``GET /workers`` → workers (``kv_block_size`` from the spec or the ``page_size`` label)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
        raise ValueError("not an SMG /workers document")
    out = []
    for w in doc["workers"]:
        if not isinstance(w, dict) or "url" not in w:
            continue
        raw = w.get("labels")
        labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        block = _int(w.get("kv_block_size")) or _int(labels.get("kv_block_size")) or _int(
            labels.get("page_size"))
        out.append(RouterWorker(
            url=str(w["url"]), model=str(w.get("model_id", "")),
            connection_mode=str(w.get("connection_mode", "")),
            runtime=str(w.get("runtime_type", w.get("runtime", ""))),
            healthy=bool(w.get("is_healthy", False)), status=str(w.get("status", "")),
            load=_int(w.get("load")) or 0, kv_block_size=block,
            mm_processor=labels.get("mm_processor"), labels=labels))
    return out


def _load(worker: str, d: dict[str, Any]) -> WorkerLoad:
    return WorkerLoad(worker, _int(d.get("dp_rank")) or 0, _int(d.get("num_running_reqs")) or 0,
                      _int(d.get("num_waiting_reqs")) or 0, _float(d.get("token_usage")) or 0.0,
                      _float(d.get("cache_hit_rate"), None))


def parse_get_loads(doc: Any) -> list[WorkerLoad]:
    """Both shapes: 1.13.0 flat ``loads[{worker, dp_rank, …}]`` and the 1.9 source's nested
    ``workers[{worker, load, details:{loads:[…]}}]``."""
    if not isinstance(doc, dict):
        raise ValueError("not a /get_loads document")
    out: list[WorkerLoad] = []
    if isinstance(doc.get("loads"), list):
        for d in doc["loads"]:
            if isinstance(d, dict) and "worker" in d:
                out.append(_load(str(d["worker"]), d))
        return out
    if isinstance(doc.get("workers"), list):
        for w in doc["workers"]:
            if not isinstance(w, dict) or "worker" not in w:
                continue
            details = w.get("details") or {}
            loads = details.get("loads") if isinstance(details, dict) else None
            if loads:
                out.extend(_load(str(w["worker"]), d) for d in loads if isinstance(d, dict))
            else:
                out.append(WorkerLoad(str(w["worker"]), 0, 0, 0, 0.0, None))
        return out
    raise ValueError("unknown /get_loads shape")


def parse_models(doc: Any) -> list[str]:
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ValueError("not an OpenAI /v1/models document")
    return [str(m["id"]) for m in doc["data"] if isinstance(m, dict) and "id" in m]


def parse_indexer_scores(doc: Any) -> dict[str, dict[int, int]]:
    """Dynamo standalone indexer ``POST /query`` → ``{worker_id: {dp_rank: matched tokens}}``
    (``{"scores": {...}, "frequencies": [...], "tree_sizes": {...}}``; not verified live)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("scores"), dict):
        raise ValueError("not a Dynamo indexer /query answer")
    out: dict[str, dict[int, int]] = {}
    for worker, ranks in doc["scores"].items():
        if isinstance(ranks, dict):
            pairs = ((_int(r), _int(v)) for r, v in ranks.items())
            out[str(worker)] = {r: n for r, n in pairs if r is not None and n is not None}
        elif (n := _int(ranks)) is not None and not isinstance(ranks, str | bool):
            out[str(worker)] = {0: n}
    return out


def summarize_indexer_dump(doc: Any) -> dict[str, dict[str, int]]:
    """Dynamo indexer ``GET /dump`` (RouterEvents keyed by ``model:tenant``) → events and
    stored blocks per key and worker. Tolerant: the event shape is not verified live."""
    if not isinstance(doc, dict):
        raise ValueError("not a Dynamo indexer /dump answer")
    out: dict[str, dict[str, int]] = {}
    for key, events in doc.items():
        per: dict[str, int] = {}
        for ev in events if isinstance(events, list) else []:
            if not isinstance(ev, dict):
                continue
            worker = str(ev.get("worker_id", "?"))
            per[f"{worker}:events"] = per.get(f"{worker}:events", 0) + 1
            inner = ev.get("event")
            data = inner.get("data") if isinstance(inner, dict) else None
            stored = data.get("stored") if isinstance(data, dict) else None
            if isinstance(stored, dict) and isinstance(stored.get("blocks"), list):
                per[f"{worker}:stored_blocks"] = (per.get(f"{worker}:stored_blocks", 0)
                                                  + len(stored["blocks"]))
        out[str(key)] = per
    return out
