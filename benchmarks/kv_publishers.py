"""Load generator: many simulated workers' KV-event streams, each a lightweight ZMQ PUB socket
on 127.0.0.1 sending vLLM-shaped batches (``[topic, seq, msgpack [ts, events, rank]]``), hosted
a few hundred to a process.

Each batch is one ``BlockStored`` of ``--blocks`` blocks (16 tokens each, fresh random hashes,
parent-chained) and, every eighth batch, a ``BlockRemoved`` of older blocks, as a busy engine
emits them. Payload tails are encoded once per worker; only the batch's timestamp is written
per send, so a process sends ~10⁵ batches/s. The aggregate rate is paced (``--rate`` blocks/s
over all workers), sends never block (a full PUB queue drops, as ZMQ does for a slow
subscriber) and every count is reported at the end.

    python benchmarks/kv_publishers.py --workers 1000 --processes 3 --rate 100000 --duration 60

prints the endpoints as ``mmlens.toml`` ``[[worker]]`` tables, waits for Enter, publishes, then
prints the totals. ``fleet_bench.py`` drives it from Python (:class:`PublisherFleet`).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import struct
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event

import msgspec
import zmq

BLOCK = 16
_TAILS = 16  # distinct payloads per worker, cycled


@dataclass(frozen=True)
class Totals:
    batches: int
    blocks: int
    dropped: int


def _tails(rng: random.Random, blocks: int) -> list[bytes]:
    """msgpack ``[ts, events, 0]`` minus its first 10 bytes (array header + float64 ts)."""
    enc = msgspec.msgpack.Encoder()
    out, parent, older = [], None, []
    for i in range(_TAILS):
        hashes = [rng.getrandbits(64) for _ in range(blocks)]
        events: list[dict[str, object]] = [{
            "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": [rng.randrange(151_000) for _ in range(blocks * BLOCK)],
            "block_size": BLOCK, "lora_id": None, "medium": "GPU"}]
        if i % 8 == 7 and older:
            events.append({"type": "BlockRemoved", "block_hashes": older[:blocks],
                           "medium": "GPU"})
        older, parent = hashes, hashes[-1]
        payload = enc.encode([0.5, events, 0])
        assert payload[:2] == b"\x93\xcb"  # fixarray(3), float64: the ts is bytes 2..10
        out.append(payload[10:])
    return out


def _serve(ports: list[int], blocks: int, rate: float, seed: int, conn: Connection,
           start: Event, duration: float) -> None:
    ctx = zmq.Context()
    socks = []
    for port in ports:
        s = ctx.socket(zmq.PUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 10_000)
        s.bind(f"tcp://127.0.0.1:{port}")
        socks.append(s)
    rng = random.Random(seed)
    tails = [_tails(rng, blocks) for _ in ports]
    conn.send("ready")
    start.wait()
    seqs = [0] * len(ports)
    sent = dropped = 0
    batches_per_s = rate / blocks
    t0 = time.monotonic()
    end = t0 + duration
    while (now := time.monotonic()) < end:
        due = int((now - t0) * batches_per_s) - sent - dropped
        if due <= 0:
            time.sleep(min(0.002, end - now))
            continue
        for _ in range(min(due, len(socks))):
            i = (sent + dropped) % len(socks)
            seq = seqs[i]
            payload = b"\x93\xcb" + struct.pack(">d", time.time()) + tails[i][seq % _TAILS]
            try:
                socks[i].send_multipart([b"", seq.to_bytes(8, "big"), payload], zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                dropped += 1
            seqs[i] = seq + 1
    conn.send((sent, sent * blocks, dropped))
    for s in socks:
        s.close(linger=0)
    ctx.term()


class PublisherFleet:
    """``workers`` publishers on ports ``base .. base + workers - 1`` in ``processes``
    processes, bound at construction; :meth:`run` publishes for ``duration`` s."""

    def __init__(self, workers: int, processes: int, base_port: int, rate: float,
                 blocks: int = 16, duration: float = 60.0) -> None:
        self.ports = list(range(base_port, base_port + workers))
        mpc = mp.get_context("spawn")
        self.start = mpc.Event()
        self.conns, self.procs = [], []
        for p in range(processes):
            mine = self.ports[p::processes]
            parent, child = mpc.Pipe()
            proc = mpc.Process(target=_serve, daemon=True, args=(
                mine, blocks, rate * len(mine) / workers, 1000 + p, child, self.start,
                duration))
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for c in self.conns:
            if not c.poll(120) or c.recv() != "ready":
                self.stop()
                raise RuntimeError("a publisher process did not start")

    def endpoints(self) -> list[str]:
        return [f"tcp://127.0.0.1:{p}" for p in self.ports]

    def run(self) -> None:
        self.start.set()

    def totals(self, timeout: float = 600.0) -> Totals:
        got = [c.recv() if c.poll(timeout) else (0, 0, 0) for c in self.conns]
        return Totals(*(sum(g[i] for g in got) for i in range(3)))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(timeout=10)


def worker_tables(endpoints: list[str]) -> str:
    return "".join(f'[[worker]]\nname = "sim-{i:05d}"\nkv_events = "{ep}"\n'
                   for i, ep in enumerate(endpoints))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--base-port", type=int, default=40000)
    ap.add_argument("--rate", type=float, default=100_000, help="blocks/s over all workers")
    ap.add_argument("--blocks", type=int, default=16, help="blocks per BlockStored")
    ap.add_argument("--duration", type=float, default=60.0)
    args = ap.parse_args()
    fleet = PublisherFleet(args.workers, args.processes, args.base_port, args.rate,
                           args.blocks, args.duration)
    try:
        print(worker_tables(fleet.endpoints()))
        print("# Enter starts publishing", file=sys.stderr)
        sys.stdin.readline()
        fleet.run()
        t = fleet.totals(args.duration + 60)
        print(f"sent {t.batches} batches, {t.blocks} blocks, dropped {t.dropped}",
              file=sys.stderr)
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
