"""A what-if scenario: a policy model with its parameters, a processing mode, a block size, a
number of workers and each engine's capacity; parsed from ``key=value,…`` and built into the
policy model the replay drives. ``baseline`` is the recorded configuration."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mmlens.whatif.policies import dynamo, simple, smg
from mmlens.whatif.policies.base import Policy
from mmlens.whatif.workload import RecordedRequest

POLICIES: dict[str, tuple[type[Policy], Mapping[str, object]]] = {
    "cache_aware": (smg.CacheAware, smg.PARAMS),
    "round_robin": (simple.RoundRobin, {}),
    "random": (simple.Random, {}),
    "consistent_hashing": (simple.ConsistentHashing, simple.PARAMS),
    "dynamo_kv": (dynamo.KvRouter, dynamo.PARAMS),
}
ALIASES = {"smg": "cache_aware", "dynamo": "dynamo_kv", "kv": "dynamo_kv"}
SCENARIO_KEYS = ("name", "policy", "mode", "block_size", "workers", "capacity_blocks", "seed")


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class Scenario:
    policy: str = "cache_aware"
    mode: str | None = None  # SMG: router | worker; Dynamo: exact | text_prefix | approximate
    block_size: int = 16
    workers: int = 2
    capacity_blocks: int = 2048
    seed: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        bits = [self.policy] + ([self.mode] if self.mode else []) + [
            f"bs{self.block_size}", f"{self.workers}w", f"{self.capacity_blocks}blk"]
        bits += [f"{k}={v}" for k, v in sorted(self.params.items())]
        return " ".join(bits)

    def build(self) -> Policy:
        cls, defaults = POLICIES[self.policy]
        kwargs: dict[str, Any] = {k: v for k, v in defaults.items() if k != "block_size"}
        if self.policy == "cache_aware":
            kwargs["mode"] = self.mode or "router"
        elif self.policy == "dynamo_kv" and self.mode:
            if self.mode == "approximate":
                kwargs["kv_events"] = False
            else:
                kwargs["mm_routing"] = self.mode
        kwargs.update(self.params)
        try:
            return cls(self.workers, self.block_size, seed=self.seed, **kwargs)
        except (TypeError, ValueError) as exc:
            raise ScenarioError(f"{self.policy}: {exc}") from exc

    def as_json(self) -> dict[str, Any]:
        return {"name": self.label, "policy": self.policy, "mode": self.mode,
                "block_size": self.block_size, "workers": self.workers,
                "capacity_blocks": self.capacity_blocks, "seed": self.seed,
                "params": dict(self.params)}


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "on", "yes"):
        return True
    if low in ("false", "off", "no"):
        return False
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse(spec: str, base: Scenario) -> Scenario:
    """``policy=cache_aware,mode=worker,capacity_blocks=1024,balance_abs_threshold=8``: the
    scenario keys change ``base``, any other key is a policy parameter (its flag's name with
    underscores), checked against the policy's own parameters."""
    fields_: dict[str, Any] = {}
    params = dict(base.params)
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ScenarioError(f"scenario item {item!r} is not key=value")
        value = _value(raw.strip())
        if key in SCENARIO_KEYS:
            fields_[key] = value
        else:
            params[key] = value
    policy = str(fields_.pop("policy", base.policy))
    policy = ALIASES.get(policy, policy)
    if policy not in POLICIES:
        raise ScenarioError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
    unknown = set(params) - set(POLICIES[policy][1])
    if unknown:
        raise ScenarioError(f"{policy} has no parameter {', '.join(sorted(unknown))} (it "
                            f"takes {', '.join(POLICIES[policy][1]) or 'none'})")
    for key in ("block_size", "workers", "capacity_blocks", "seed"):
        if key in fields_ and (not isinstance(fields_[key], int) or fields_[key] < (
                0 if key == "seed" else 1)):
            raise ScenarioError(f"{key} must be a positive integer, not {fields_[key]!r}")
    mode = fields_.pop("mode", base.mode if policy == base.policy else None)
    out = replace(base, policy=policy, mode=None if mode is None else str(mode),
                  params=params, name=str(fields_.pop("name", "")), **fields_)
    out.build()  # refuse a bad mode or parameter now, not mid-run
    return out


def recorded_workers(workload: Sequence[RecordedRequest]) -> list[str]:
    """The workers the recording used, in a fixed order (the baseline's worker indices)."""
    return sorted({r.worker for r in workload if r.worker})


def baseline(workload: Sequence[RecordedRequest], *, capacity_blocks: int,
             block_size: int | None = None) -> Scenario:
    """The recorded configuration: the router kind and processing mode most requests went
    through, as many workers as served them, the layouts' block size."""
    kinds = Counter(r.router_kind for r in workload if r.router_kind in ("smg", "dynamo"))
    kind = kinds.most_common(1)[0][0] if kinds else "smg"
    sizes = Counter(r.keys.block_size for r in workload if r.keys is not None)
    bs = block_size or (sizes.most_common(1)[0][0] if sizes else 16)
    workers = max(len(recorded_workers(workload)), 1)
    if kind == "dynamo":
        glm = any("glm" in r.model.lower() for r in workload)
        return Scenario("dynamo_kv", "text_prefix" if glm else "exact", bs, workers,
                        capacity_blocks, name="baseline (recorded)")
    modes = Counter(r.mode for r in workload if r.mode in ("router", "worker"))
    mode = modes.most_common(1)[0][0] if modes else "router"
    return Scenario("cache_aware", mode, bs, workers, capacity_blocks,
                    name="baseline (recorded)")
