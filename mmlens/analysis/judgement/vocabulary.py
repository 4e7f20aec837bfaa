"""The verdict vocabulary, and the router words it is read from."""

from __future__ import annotations

CATEGORIES: tuple[str, ...] = (
    "hit", "false_hit", "cold", "spilled", "count_drift", "fallback", "evicted",
    "events_blind", "unexplained", "error", "hit_or_false_hit", "hit_or_spilled", "hit_or_cold",
    "unknown")
"""``unknown``: evidence truly absent (no realized hit and a prediction that needs one);
``hit_or_…``: the evidence allows two readings (the verdict's ``reason`` says why). A request
not judged yet has no verdict at all: views show it as pending (null in JSON)."""

MISSES = frozenset({"false_hit", "cold", "spilled", "count_drift", "fallback", "evicted",
                    "events_blind", "unexplained", "hit_or_false_hit", "hit_or_spilled",
                    "hit_or_cold"})

# Router warnings that mean it did not route on image content. Branch names are not read
# here: SMG's ``expected_wait_fallback`` is its first-sight branch (min load, nothing matched).
FALLBACK_MARKERS = ("fallback", "text-prefix", "text-only", "skipping mm routing",
                    "mm routing entry skipped", "not supported for mm-aware",
                    "expected 206", "cardinality mismatch", "not built")
# Branches on which the router found no prefix anywhere (SMG tree/event/hash paths).
MISS_BRANCHES = frozenset({"event_miss", "expected_wait_fallback", "min_load_fallback",
                           "first_healthy_fallback", "no_tree_random", "kv_pressure_min_load",
                           "short_request"})
SPILL_BRANCHES = frozenset({"spill", "hash_spill", "event_spill"})

ERROR_HINTS = {
    "multimodal_worker_processing_unsupported_model": (
        "SMG refuses worker-side expansion for this model (not worker-expandable in SMG 1.13): "
        "run with --mm-processing auto or router"),
    "no_media_ref_capable_worker": (
        "strict worker processing, but no worker advertises mm_processor: start the workers "
        "with in-process media processing or use --mm-processing auto"),
    "multimodal_prompt_contract_mismatch": (
        "the chat template emitted a different number of image anchors than the request has "
        "images: check the template's image branch"),
    "multimodal_processing_failed": (
        "the router could not fetch or decode an image (private hosts need "
        "--mm-allow-private-media-hosts on SMG, DYN_MM_ALLOW_INTERNAL=1 on Dynamo)"),
}


def counts(categories: list[str]) -> dict[str, int]:
    """Requests per category, every category present (0 when none)."""
    out = dict.fromkeys(CATEGORIES, 0)
    for c in categories:
        out[c] = out.get(c, 0) + 1
    return out
