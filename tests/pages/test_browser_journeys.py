"""The three things users come for, walked in a real browser (Debian's Chromium driven by
Playwright) on `mmlens dashboard --demo`: a miss found and explained from the Overview in at
most three clicks; A/B/A/B with B cold, then both warm on two workers; the same request
observed in router and worker mode with both engines' counts. Each asserts what is on the
screen (and checks it against the store) and leaves a screenshot in artifacts/journeys/."""

from __future__ import annotations

import re
from typing import Any

import pytest

from mmlens.analysis.views.cause import cause_sentence, default_partner
from mmlens.analysis.views.common import worker_label, worker_names
from mmlens.store.reader import StoreReader
from tests.live_support import REPO
from tests.pages.conftest import LiveDashboard

pytestmark = [pytest.mark.live, pytest.mark.slow]

SHOTS = REPO / "artifacts" / "journeys"
WAIT_MS = 60_000
STEP = re.compile(r"(?P<step>[AB](?: again)?) → (?P<worker>w\d): (?P<pct>\d+)% cached "
                  r"\((?P<verdict>\w+)\)")
COUNTS = re.compile(r"demo \(router mode, (?P<rw>w\d)\) (?P<rn>\d+) · demo-worker \(worker "
                    r"mode, (?P<ww>w\d)\) (?P<wn>\d+)")


def _main(page: Any) -> Any:
    return page.locator("[data-testid='stMain']")


def _shot(page: Any, name: str) -> None:
    """Full-page screenshots at a desktop and a narrow (800 px) width."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for width in (1600, 800):
        page.set_viewport_size({"width": width, "height": 2000})
        page.wait_for_timeout(1500)  # let Streamlit re-lay and Plotly redraw
        page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 2000})


def _no_traceback(page: Any) -> None:
    assert page.locator("[data-testid='stException']").count() == 0


def _settled_line(body: Any) -> str:
    """The Lab's summary line once every step's stored verdict is in (pending until the
    collector judged it; the results re-read it)."""
    line = body.get_by_text(re.compile(r"^A → w\d")).first
    line.wait_for(state="visible", timeout=WAIT_MS)
    for _ in range(60):
        text = line.inner_text()
        if "(pending)" not in text:
            return text
        body.page.wait_for_timeout(1000)
    raise AssertionError(f"verdicts still pending: {text}")


def _lab(page: Any, url: str) -> Any:
    page.goto(f"{url}/lab", wait_until="domcontentloaded")
    body = _main(page)
    body.get_by_role("button", name="Send").wait_for(state="visible", timeout=WAIT_MS)
    return body


def test_a_fresh_demo_raises_only_its_deliberate_false_hit(live_dashboard: LiveDashboard,
                                                          browser_page: Any) -> None:
    """A healthy cluster looks healthy: the one firing alert is the warm-up's content-blind
    false hit (a real SMG behaviour), with its Explain link first; no view-divergence or
    staleness alarm, not even pending."""
    page = browser_page
    page.goto(f"{live_dashboard.url}/", wait_until="domcontentloaded")
    body = _main(page)
    body.get_by_text("firing since", exact=False).first.wait_for(state="visible",
                                                                 timeout=WAIT_MS)
    page.wait_for_timeout(6000)  # one more refresh of the live fragment
    firing = [t for t in body.locator("[data-testid='stAlert']").all_inner_texts()
              if "firing since" in t]
    assert len(firing) == 1 and firing[0].startswith("false_hits"), firing
    links = body.get_by_role("link", name=re.compile(r"^Explain ")).all_inner_texts()
    assert links and links[0].split("Explain ", 1)[1].startswith("mmlens-")
    text = body.inner_text()
    assert "0 pending" in text
    for noise in ("kv_view_divergence", "stale", "kv_events_silent", "worker_gone"):
        assert noise not in text, noise
    _no_traceback(page)
    _shot(page, "0-quiet-overview")
    # At 800 px the sidebar slims and no metric label is cut ("Engine hit r…").
    page.set_viewport_size({"width": 800, "height": 2000})
    page.wait_for_timeout(1500)
    cut = page.evaluate("""() => [...document.querySelectorAll("[data-testid='stMetricLabel']")]
        .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)""")
    assert not cut, cut
    sidebar = page.locator("section[data-testid='stSidebar']").bounding_box()
    assert sidebar is not None and sidebar["width"] <= 200, sidebar
    page.set_viewport_size({"width": 1400, "height": 2000})


def test_a_miss_is_found_and_explained_from_the_overview(live_dashboard: LiveDashboard,
                                                         browser_page: Any) -> None:
    page, clicks = browser_page, 0
    page.goto(f"{live_dashboard.url}/", wait_until="domcontentloaded")
    body = _main(page)
    alert = body.get_by_text("false_hits", exact=False).first
    alert.wait_for(state="visible", timeout=WAIT_MS)
    link = body.get_by_role("link", name=re.compile(r"^Explain mmlens-")).first
    link.wait_for(state="visible", timeout=WAIT_MS)
    rid = link.inner_text().strip().split("Explain ", 1)[1]
    link.click()
    clicks += 1
    page.wait_for_url(re.compile(rf"/inspector\?request={rid}$"), timeout=WAIT_MS)
    body.get_by_text("Why this many cached tokens").wait_for(state="visible", timeout=WAIT_MS)
    verdict = body.get_by_text(re.compile(r"^false_hit — content-blind false hit")).first
    verdict.wait_for(state="visible", timeout=WAIT_MS)
    assert "the engine found 0" in verdict.inner_text()
    assert clicks <= 3
    _no_traceback(page)
    reader = StoreReader(live_dashboard.db)
    try:
        verdict = reader.verdict(rid)
    finally:
        reader.close()
    assert verdict is not None and verdict.category == "false_hit"
    _shot(page, "1-miss-explained")


def test_abab_b_cold_then_both_warm_on_two_workers(live_dashboard: LiveDashboard,
                                                   browser_page: Any) -> None:
    page = browser_page
    body = _lab(page, live_dashboard.url)
    run = body.locator("[data-testid='stSelectbox']").filter(has_text="Run")
    assert run.locator("input").input_value().startswith("A and B at once")  # the default
    body.get_by_role("button", name="Send").click()
    body.get_by_text("Cached vs computed tokens per step").wait_for(state="visible",
                                                                    timeout=WAIT_MS)
    text = _settled_line(body)
    steps = {m["step"]: m for m in STEP.finditer(text)}
    assert set(steps) == {"A", "B", "A again", "B again"}, text
    a, b, a2, b2 = (steps[k] for k in ("A", "B", "A again", "B again"))
    assert a["worker"] != b["worker"], text  # the seeds: on two workers
    assert int(b["pct"]) < 10 and b["verdict"] != "hit"  # B (new pixels) is cold
    assert (a2["worker"], b2["worker"]) == (a["worker"], b["worker"])  # back to their seeds
    assert int(a2["pct"]) > 50 and int(b2["pct"]) > 50  # and both warm
    assert a2["verdict"] == b2["verdict"] == "hit"
    assert a["verdict"] == b["verdict"] == "seed"  # first sends are framed as seeds
    # The experiment's banner: distinct sizes pass, and say why.
    banner = body.get_by_text(re.compile(r"^PASS — every replay went back")).first
    banner.wait_for(state="visible", timeout=WAIT_MS)
    assert f"A again → {a['worker']} {a2['pct']}% cached" in banner.inner_text()
    # The chart says the same: each step's bar is labelled with its worker.
    ticks = " ".join(page.locator(".js-plotly-plot .xtick text").all_text_contents())
    assert "w1" in ticks and "w2" in ticks
    _no_traceback(page)
    _shot(page, "2-abab-two-workers")


def test_same_size_abab_on_smg_fails_with_the_content_blind_reason(
        live_dashboard: LiveDashboard, browser_page: Any) -> None:
    """Two images of one size: the Lab warns before sending, and the run fails, naming SMG's
    content-blind routing (what the real router did is checked against the store)."""
    page = browser_page
    body = _lab(page, live_dashboard.url)
    sizes = body.get_by_label("Sizes (WxH, comma-separated; image i takes the i-th)")
    sizes.fill("640x480")
    sizes.press("Enter")
    body.get_by_text("A and B are both 640x480: SMG routes on token ids",
                     exact=False).first.wait_for(state="visible", timeout=WAIT_MS)
    body.get_by_role("button", name="Send").click()
    banner = body.get_by_text(re.compile(r"^FAIL — ")).first
    banner.wait_for(state="visible", timeout=WAIT_MS)
    reason = banner.inner_text()
    assert "SMG routes same-size images by position, not content" in reason, reason
    steps = {m["step"]: m for m in STEP.finditer(_settled_line(body))}
    a, b, a2, b2 = (steps[k] for k in ("A", "B", "A again", "B again"))
    # The reason names what happened: B seeded on A's worker, or a replay on the other's.
    assert (b["worker"] == a["worker"] and reason.startswith(f"FAIL — B went to {a['worker']}, "
                                                             "A's worker")) or \
        (a2["worker"] != a["worker"] and reason.startswith("FAIL — A again went to")) or \
        (b2["worker"] != b["worker"] and reason.startswith("FAIL — B again went to")), reason
    reader = StoreReader(live_dashboard.db)
    try:
        newest = [t for t in reader.recent_traces(20) if t.origin == "mmlens"][:4]
    finally:
        reader.close()
    # The store's four newest: two images, one size, one expanded length.
    assert len({t.prompt_tokens for t in newest}) == 1
    _no_traceback(page)
    _shot(page, "2b-abab-same-size-fails")


def test_one_request_observed_in_router_and_worker_mode(live_dashboard: LiveDashboard,
                                                        browser_page: Any) -> None:
    page = browser_page
    body = _lab(page, live_dashboard.url)
    body.locator("[data-testid='stSelectbox']").filter(has_text="Run").click()
    page.get_by_role("option", name="one request").click()
    body.get_by_text("Compare across routers").click()
    page.wait_for_timeout(500)
    body.get_by_role("button", name="Send").click()
    body.get_by_text("Router mode vs worker mode: request").wait_for(state="visible",
                                                                    timeout=WAIT_MS)
    counts = body.get_by_text("Engine prompt_tokens observed:").first
    m = COUNTS.search(counts.inner_text())
    assert m, counts.inner_text()
    router_n, worker_n = int(m["rn"]), int(m["wn"])
    assert router_n > 100 and worker_n > 100
    # Equal counts are explained as such; a difference would be named as count drift.
    explained = f"counted {router_n} prompt tokens in every mode" if router_n == worker_n \
        else "count drift"
    body.get_by_text(explained, exact=False).first.wait_for(state="visible", timeout=WAIT_MS)
    body.get_by_text("in worker mode it routed on", exact=False).first.wait_for(
        state="visible", timeout=WAIT_MS)
    _no_traceback(page)
    # What the screen shows is what the engines answered (the store's two newest traces).
    reader = StoreReader(live_dashboard.db)
    try:
        newest = {t.router: t for t in reversed(reader.recent_traces(10)) if t.origin == "mmlens"}
        routers = {r["name"]: r["url"] for r in reader.meta("targets")["routers"]}
    finally:
        reader.close()
    assert newest[routers["demo"]].prompt_tokens == router_n
    assert newest[routers["demo-worker"]].prompt_tokens == worker_n
    _shot(page, "3-router-vs-worker-mode")


def test_a_request_opens_with_its_cause_and_a_side_by_side_diff(
        live_dashboard: LiveDashboard, browser_page: Any) -> None:
    """The inspector's first line says what happened and which worker held the blocks (from
    the stored verdict), and the request sits next to its replay with what differs marked."""
    reader = StoreReader(live_dashboard.db)
    try:
        names = worker_names(reader.meta("targets"))
        traces = [t for t in reader.recent_traces(100) if t.origin == "mmlens" and t.images]
        verdicts = reader.verdicts_for(traces)
    finally:
        reader.close()
    replay = next(t for t in traces if (v := verdicts.get(t.request_id)) is not None
                  and v.category == "hit" and v.better_worker)
    v = verdicts[replay.request_id]
    sentence = cause_sentence(v, names)
    assert f"{worker_label(v.better_worker, names)} held {v.better_blocks} of these" in sentence
    page = browser_page
    page.goto(f"{live_dashboard.url}/inspector?request={replay.request_id}",
              wait_until="domcontentloaded")
    body = _main(page)
    body.get_by_text(sentence).first.wait_for(state="visible", timeout=WAIT_MS)
    partner = default_partner(replay, traces)
    assert partner is not None
    body.get_by_text(f"Side by side with {partner.request_id}").first.click()
    table = body.locator("[data-testid='stExpander'] table").first
    table.wait_for(state="visible", timeout=WAIT_MS)
    text = table.inner_text()
    assert replay.request_id in text and partner.request_id in text
    assert "image identity (SMG)" in text and "◆" in text  # their verdicts or workers differ
    _no_traceback(page)
    _shot(page, "4-cause-and-diff")
