"""Dynamo's event plane: the KV events its router consumes, over NATS or the ZMQ broker.

Wire facts (observed on Dynamo 1.6.1, file/etcd discovery):
- subject ``namespace.<ns>.component.<component>.endpoint.<endpoint>.<topic>``; KV events
  travel on topic ``kv-events`` (also on the bus: ``kv_metrics``, ``active_sequences_events``);
- a NATS message's data is a msgpack map ``{publisher_id, sequence, published_at (ms), topic,
  payload (bin)}``; ``sequence`` counts from 0 per publisher;
- the ZMQ broker (XPUB side) relays 4 frames ``[subject, publisher_id (8 B big-endian),
  sequence (8 B big-endian), body]``, body = a version byte (1), a 4-byte big-endian length and
  the same msgpack envelope;
- the envelope's payload is a msgpack array of router events ``{worker_id, storage_tier,
  residency_domain, event: {event_id, data, dp_rank}}``, ``data`` one of ``{"stored":
  {parent_hash, start_position, blocks: [{block_hash, tokens_hash, mm_extra_info}]}}``,
  ``{"removed": {block_hashes}}`` or ``"cleared"``.

``block_hash`` is the engine's own hash (what the engine's ZMQ events carry); ``tokens_hash``
is the router's recomputed content hash. Events become the same records as the engines'
(worker = the Dynamo worker id in decimal), with ``block_size`` 0: the plane does not carry it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmlens.ingest.kv_events import (
    MAX_TS,
    KVEventError,
    decode_payload,
    keyed_events,
    normalize_hash,
)
from mmlens.records import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

KV_TOPIC = "kv-events"
BROKER_BODY_VERSION = 1


@dataclass(frozen=True, slots=True)
class PlaneMessage:
    """One event-plane message: who published it, its place in that publisher's sequence."""

    subject: str
    publisher_id: int
    sequence: int
    published_at: float  # seconds
    topic: str
    payload: bytes

    @property
    def is_kv(self) -> bool:
        return self.topic == KV_TOPIC or self.subject.endswith("." + KV_TOPIC)


def kv_subject(namespace: str = "*", component: str = "*", endpoint: str = "*") -> str:
    """The NATS subject (wildcards allowed) of a Dynamo deployment's KV events."""
    return f"namespace.{namespace}.component.{component}.endpoint.{endpoint}.{KV_TOPIC}"


def _envelope(subject: str, data: bytes) -> PlaneMessage:
    env = decode_payload(data)  # raises too_deep for nesting past the interpreter's limit
    if not isinstance(env, dict):
        raise KVEventError("bad_envelope", f"envelope is a {type(env).__name__}")
    pub, seq, at, payload = (env.get(k) for k in (
        "publisher_id", "sequence", "published_at", "payload"))
    for name, value in (("publisher_id", pub), ("sequence", seq), ("published_at", at)):
        if type(value) is not int or value < 0:
            raise KVEventError("bad_envelope", f"{name} {value!r}")
    if at > MAX_TS * 1000:  # milliseconds
        raise KVEventError("bad_envelope", f"published_at {at!r}")
    if not isinstance(payload, bytes):
        raise KVEventError("bad_envelope", "payload is not bytes")
    topic = env.get("topic")
    return PlaneMessage(subject, pub, seq, at / 1000.0,
                        topic if isinstance(topic, str) else subject.rsplit(".", 1)[-1],
                        payload)


def decode_nats(subject: str, data: bytes) -> PlaneMessage:
    return _envelope(subject, data)


def decode_broker_frames(frames: list[bytes]) -> PlaneMessage:
    """The 4 frames the Dynamo ZMQ broker relays to a subscriber."""
    if len(frames) != 4:
        raise KVEventError("truncated_frame", f"{len(frames)} frames (Dynamo sends 4)")
    subject, pub, seq, body = frames
    if len(pub) != 8 or len(seq) != 8:
        raise KVEventError("truncated_frame", "publisher or sequence frame is not 8 bytes")
    if len(body) < 5 or body[0] != BROKER_BODY_VERSION:
        raise KVEventError("bad_envelope", f"body version {body[:1].hex() or 'missing'}")
    length = int.from_bytes(body[1:5], "big")
    if length != len(body) - 5:
        raise KVEventError("truncated_frame", f"body says {length} bytes, has {len(body) - 5}")
    msg = _envelope(subject.decode("utf-8", "replace"), body[5:])
    if msg.sequence != int.from_bytes(seq, "big") or msg.publisher_id != int.from_bytes(
            pub, "big"):
        raise KVEventError("bad_envelope", "frame header and envelope disagree")
    return msg


def looks_like_dynamo_plane(frames: list[bytes]) -> bool:
    """True for frames from Dynamo's ZMQ event plane (what a vLLM subscriber would count as
    ``truncated_frame: 4 frames``)."""
    return len(frames) == 4 and frames[0].startswith(b"namespace.") and len(frames[1]) == 8


def _event(raw: Any, seq: int, ts: float) -> KVEvent:
    if not isinstance(raw, dict) or not isinstance(raw.get("event"), dict):
        raise KVEventError("bad_event", "router event without an event map")
    worker_id = raw.get("worker_id")
    if type(worker_id) is not int or worker_id < 0:
        raise KVEventError("bad_event", f"worker_id {worker_id!r}")
    ev = raw["event"]
    rank = ev.get("dp_rank") or 0
    if type(rank) is not int or not 0 <= rank <= 65535:
        raise KVEventError("bad_number", f"dp_rank {rank!r}")
    worker = str(worker_id)
    data = ev.get("data")
    if data == "cleared" or (isinstance(data, dict) and "cleared" in data):
        return AllBlocksCleared(worker, rank, seq, ts)
    if isinstance(data, dict) and isinstance(data.get("stored"), dict):
        stored = data["stored"]
        blocks = stored.get("blocks")
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise KVEventError("bad_event", "stored without a blocks list")
        parent = stored.get("parent_hash")
        return BlockStored(worker, rank, seq, ts,
                           [normalize_hash(b.get("block_hash")) for b in blocks],
                           None if parent is None else normalize_hash(parent), [], 0,
                           raw.get("storage_tier") if isinstance(
                               raw.get("storage_tier"), str) else None)
    if isinstance(data, dict) and isinstance(data.get("removed"), dict):
        hashes = data["removed"].get("block_hashes")
        if not isinstance(hashes, list):
            raise KVEventError("bad_event", "removed without block_hashes")
        return BlockRemoved(worker, rank, seq, ts, [normalize_hash(h) for h in hashes])
    raise KVEventError("unknown_event_tag", repr(data)[:60])


def router_events(msg: PlaneMessage, errors: dict[str, int] | None = None) -> list[KVEvent]:
    """The KV events of one ``kv-events`` message; bad events are counted in ``errors`` by
    kind and skipped (raised when ``errors`` is None)."""
    items = decode_payload(msg.payload)
    if not isinstance(items, list):
        items = [items]
    return keyed_events(items, lambda raw: _event(raw, msg.sequence, msg.published_at), errors,
                        f"{msg.subject} seq {msg.sequence}")
