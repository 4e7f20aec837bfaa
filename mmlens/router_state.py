"""Router admin JSON (SMG ``/workers``, ``/get_loads``) → RouterWorker / WorkerLoad records."""

from __future__ import annotations

from typing import Any

from mmlens.records import RouterWorker, WorkerLoad


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def parse_smg_workers(doc: Any) -> list[RouterWorker]:
    """``GET /workers`` → workers (``kv_block_size`` from the spec or the ``page_size`` label)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
        raise ValueError("not an SMG /workers document")
    out = []
    for w in doc["workers"]:
        if not isinstance(w, dict) or "url" not in w:
            continue
        labels = {str(k): str(v) for k, v in (w.get("labels") or {}).items()}
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
    chr_ = d.get("cache_hit_rate")
    return WorkerLoad(worker, _int(d.get("dp_rank")) or 0, _int(d.get("num_running_reqs")) or 0,
                      _int(d.get("num_waiting_reqs")) or 0, float(d.get("token_usage") or 0.0),
                      None if chr_ is None else float(chr_))


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
