"""Every page on a store of constructed records: renders without a traceback, the charts carry
the right traces, the widgets drive the page, and empty or missing stores give clear states."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mmlens.analysis.views.common import MISS_VERDICTS
from mmlens.store.open import open_store
from mmlens.store.sqlite import Store
from tests.pages.apptest_util import (
    PAGES,
    assert_clean,
    chart_markup,
    decision_rows_drawn,
    drawn_decisions,
    figure_titled,
    figures,
    frames,
    icicle_drawn,
    layout_drawn,
    lines_titled,
    messages,
    metrics,
    open_page,
    sankey_drawn,
    svg_bars,
    trace_names,
)
from tests.pages.recorded_store import W1, Recorded


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_without_traceback(db: Recorded, page: str) -> None:
    at = open_page(page)
    assert_clean(at)
    assert at.title, f"{page} has no title"
    for frame in frames(at):  # a gap reads "—", never "None"/"nan"
        cells = {str(v) for v in frame.to_numpy().ravel()}
        assert not cells & {"None", "nan", "NaN", "<NA>"}, (page, frame)


def test_overview_headline_and_alerts_name_their_cause(db: Recorded) -> None:
    at = open_page("overview")
    assert_clean(at)
    shown = metrics(at)
    # W1 40/100 and W2 10/80 tokens per scrape: (40+10)/(100+80) over the window.
    assert shown["Engine hit rate (token-weighted)"] == "28%"
    assert shown["Image requests in router mode"] == "100%"
    # Available vs achieved over the recorded requests (each against those before it):
    # 80 of 944 prompt tokens cached; 80 + 64 held by the best worker at decision time.
    assert shown["Achieved vs available hit rate"] == "8% of 15%"
    assert shown["Top cause"] == "unexplained"
    text = messages(at)
    assert any("kv_events_silent" in m and "silent for w2:" in m for m in text["error"])
    assert any("false_hits" in m and "req-false-hit" in m for m in text["warning"])
    # One click from the alert into the inspector, where the miss is explained.
    links = {p.proto.label: p.proto.query_string for p in at.page_link}
    assert f"request={db.false_hit_id}" in links[f"Explain {db.false_hit_id}"]
    bars = svg_bars(at, "hit rate per worker")
    assert sorted(bars["x"]) == ["w1", "w2"]
    assert all(0.0 <= y <= 1.0 for y in bars["y"]) and all(bars["hover"])
    assert not figures(at)  # no Plotly chart: a new tab of the Overview never loads its code


def test_any_page_loads_the_recent_requests_tokenizers_ahead(db: Recorded) -> None:
    """Opening the Overview starts loading the tokenizer the inspector will need for the
    recorded requests' layout model, in the background, once per store."""
    from mmlens.ui import shared

    from mmlens.layout.tokenizers import family_tokenizer

    family_tokenizer.cache_clear()
    shared._tokenizers_loading.clear()
    at = open_page("overview")
    assert_clean(at)
    thread = shared.load_tokenizers_soon()
    assert thread is not None and thread is shared.load_tokenizers_soon()  # one per store
    thread.join(30)
    assert family_tokenizer.cache_info().currsize >= 1


def test_the_tokenizers_head_start_reads_on_its_own_connection(db: Recorded) -> None:
    """The head start never takes the pages' shared reader: with its lock held (a page's
    read in progress) the tokenizer still loads."""
    from mmlens.ui import shared

    from mmlens.layout.tokenizers import family_tokenizer

    open_page("overview")
    family_tokenizer.cache_clear()
    shared._tokenizers_loading.clear()
    reader = shared._reader(str(db.path))
    with reader.lock:
        thread = shared._tokenizers_loading(str(db.path))
        thread.join(30)
        assert not thread.is_alive()
    assert family_tokenizer.cache_info().currsize >= 1


def test_the_head_start_reads_the_largest_trace_window_ahead(db: Recorded) -> None:
    """Once the head start has run, the Affinity page's window is read (no page run decodes
    it) and holds what a read of the store gives; a smaller window being read by another
    thread is not waited for."""
    import threading

    from mmlens.ui import shared

    from mmlens.store.reader import StoreReader

    path = str(db.path)
    open_page("targets")
    shared.forget_store_reads()
    shared._tokenizers_loading.clear()
    shared._tokenizers_loading(path).join(30)
    window = shared._trace_window(path, shared.AHEAD_TRACES)
    assert window.versions is not None and window.traces
    ahead = window.traces
    assert shared.recent_traces(path, shared.AHEAD_TRACES) is ahead  # served, not read again
    reader = StoreReader(path)
    try:
        assert [t.request_id for t in ahead] == [
            t.request_id for t in reader.recent_traces(shared.AHEAD_TRACES)]
    finally:
        reader.close()
    assert [t.request_id for t in shared.recent_traces(path, 2)] == [
        t.request_id for t in ahead[:2]]
    shared._trace_window.clear()
    shared.forget_store_reads()
    shared._read_ahead(path, shared._reader(path))
    done = threading.Event()
    with shared._trace_window(path, shared.AHEAD_TRACES).lock:  # a read in progress
        threading.Thread(target=lambda: (shared.recent_traces(path, 3), done.set()),
                         daemon=True).start()
        assert done.wait(10), "a page run waited for a larger window being read"


def test_inspector_deep_link_shows_layout_with_image_identity(db: Recorded) -> None:
    at = open_page("inspector", {"request": db.hit_id})
    assert_clean(at)
    assert at.selectbox(key="inspector_request").value == db.hit_id
    fig = layout_drawn(at)
    names = trace_names(fig)
    assert {"text", "special", "structural", "cached (engine)", "router predicted"} <= set(names)
    image = [t for t in fig["data"] if (t.get("name") or "").startswith("image 0")]
    assert len(image) == 1 and image[0]["type"] == "bar"
    assert image[0]["y"] == ["router view (81)"]  # 18 rendered − 1 anchor + 64
    anchors = [t for t in fig["data"] if t.get("name") == "anchor"]
    assert anchors[0]["y"] == ["worker view (18)"]
    hover = next(t for t in fig["data"] if t.get("name") == "blocks")
    assert any("hash " in h for h in hover["hovertext"])
    assert any("extra_keys" in h for h in hover["hovertext"])
    assert metrics(at)["Engine prompt_tokens"] == "81"


def test_inspector_choosing_a_request_changes_the_figure(db: Recorded) -> None:
    at = open_page("inspector", {"request": db.hit_id})
    before = trace_names(layout_drawn(at))
    at.selectbox(key="inspector_request").set_value(db.two_image_id).run()
    assert_clean(at)
    after = trace_names(layout_drawn(at))
    assert before != after
    assert sum(1 for n in after if n.startswith("image ")) == 2
    assert at.query_params["request"] in (db.two_image_id, [db.two_image_id])


def test_inspector_marks_count_drift_and_false_hit(db: Recorded) -> None:
    at = open_page("inspector", {"request": db.drift_id})
    warnings = messages(at)["warning"]
    assert any("First divergent block" in w and "count_drift" in w for w in warnings)
    fig = layout_drawn(at)
    annotations = [a["text"] for a in fig["layout"].get("annotations", [])]
    assert any("count_drift" in a for a in annotations)

    at = open_page("inspector", {"request": db.false_hit_id})
    warnings = messages(at)["warning"]
    assert any("image_identity" in w and "content-blind" in w for w in warnings)


def test_inspector_compose_mode_follows_its_widgets(db: Recorded) -> None:
    at = open_page("inspector")
    at.radio(key="inspector_mode").set_value("Compose").run()
    assert_clean(at)
    router_row = next(t for t in layout_drawn(at)["data"] if t.get("name", "").startswith(
        "image 0"))["y"][0]
    assert router_row.startswith("router view (")
    at.text_input(key="compose_sizes").set_value("1280x720").run()
    image = next(t for t in layout_drawn(at)["data"] if t.get("name", "").startswith("image 0"))
    assert image["x"] == [880]  # Qwen3-VL 1280×720
    at.number_input(key="compose_drift").set_value(3).run()
    assert any("count_drift" in w for w in messages(at)["warning"])
    at.text_input(key="compose_url").set_value("http://127.0.0.1:9/cat.png").run()
    names = trace_names(layout_drawn(at))
    assert sum(n.startswith("image ") for n in names) == 2  # generated + URL image
    at.text_input(key="compose_sizes").set_value("banana").run()
    assert_clean(at)
    assert any("not an image size" in e for e in messages(at)["error"])


def test_inspector_shows_each_router_s_view_and_outcome(db: Recorded) -> None:
    at = open_page("inspector")
    at.radio(key="inspector_mode").set_value("Compose").run()
    at.text_input(key="compose_sizes").set_value("640x480, 4500x20").run()
    assert_clean(at)  # an image over 200:1 is an outcome per router, not a page error
    table = next(d for d in frames(at) if "outcome" in d.columns)
    outcomes = dict(zip(table["party"], table["outcome"], strict=True))
    assert outcomes == {"engine (HF semantics)": "refuse", "SMG 1.13": "refuse",
                        "Dynamo 1.6.1": "exact"}
    assert table.loc[table["party"] == "Dynamo 1.6.1", "image tokens"].item() == "300, 1"
    warnings = messages(at)["warning"]
    assert any("aspect ratio" in w and "each router's outcome" in w for w in warnings)
    assert any("Dynamo 1.6.1 — engine refuses" in w for w in warnings)


def test_routing_page_charts_and_tables(db: Recorded) -> None:
    at = open_page("routing")
    assert_clean(at)
    modes = svg_bars(at, "processing mode")
    assert modes["y"] and all(y > 0 for y in modes["y"])
    assert any("router / auto_mixed" in n for n in modes["series"])
    branches = svg_bars(at, "branches")
    assert set(branches["x"]) == {"event_hit", "expected_wait_fallback"}
    assert not figures(at)  # every Routing chart is SVG: a new tab of it loads no Plotly
    decisions = drawn_decisions(at)
    errors = next(d for d in frames(at) if "error_code" in d.columns)
    assert db.hit_id in set(decisions["request"])
    row = errors[errors["request"] == db.error_id].iloc[0]
    assert row["error_code"] == "no_media_ref_capable_worker"
    assert "mm_processor" in row["what to change"]


def test_routing_decisions_show_candidates_scores_and_gates(db: Recorded) -> None:
    at = open_page("routing")
    assert_clean(at)
    decisions = drawn_decisions(at).set_index("request")
    hit = decisions.loc[db.hit_id]
    assert (hit["verdict"], hit["branch"], hit["overlap"]) == ("hit", "event_hit", "5/5")
    # The router's branch says event_hit on the false hit too; the verdict and its reason
    # say what the engine found.
    false_hit = decisions.loc[db.false_hit_id]
    assert (false_hit["verdict"], false_hit["branch"]) == ("false_hit", "event_hit")
    assert false_hit["why"].startswith("content-blind false hit")
    assert any("miss(es) of" in c.value and "false_hit 1" in c.value for c in at.caption)
    # Workers by the names the config gives them.
    assert (hit["worker"], hit["candidates"]) == ("w1", "w1 load 2 · w2 load 0")
    assert "affinity w1: 5 blocks" in hit["scores"]
    assert "wait w2: 0 s" in hit["scores"]
    assert hit["gates"] == "w1: load 2 vs avg 1 ×1.5 / +64 → stay"
    assert "on w1" in decisions.loc[db.false_hit_id, "why"]
    assert hit["policy"] == "cache_aware / policy / event_index_overlap"
    # Traces without a logged cache trace keep the header's word only.
    assert decisions.loc[db.false_hit_id, "candidates"] == "—"
    at.selectbox(key="routing_decision").set_value(db.hit_id).run()
    assert_clean(at)
    detail = next(d for d in frames(at) if "chosen" in d.columns)
    assert detail.set_index("worker").loc["w1", "chosen"]
    gates = next(d for d in frames(at) if "spill" in d.columns)
    assert not gates["spill"].iloc[0]


def test_routing_decisions_are_a_static_table_of_the_same_rows(db: Recorded) -> None:
    """The recent decisions are drawn as one static table (no data frame, no Styler): the
    rows and cells the data frame held, each row in its verdict's colour and each request a
    link to it in the inspector."""
    from mmlens.ui import shared

    from mmlens.analysis.views.common import VERDICT_COLOURS, router_names
    from mmlens.analysis.views.routing import decision_table
    from mmlens.figures.cache import inspector_link
    from mmlens.figures.html_table import cell_text

    at = open_page("routing")
    assert_clean(at)
    assert not at.dataframe  # a new Routing tab loads no data table code
    path = str(db.path)
    expected = shared.table(decision_table(
        shared.recent_traces(path, 200), shared.recent_verdicts(path, 200),
        shared.worker_names(path), routers=router_names(shared.meta(path, "targets"))))
    drawn = drawn_decisions(at)
    assert list(drawn.columns) == list(expected.columns) and len(drawn) == len(expected) >= 4
    assert [[cell_text(v) for v in row] for row in drawn.itertuples(index=False)] == [
        [cell_text(v) for v in row] for row in expected.itertuples(index=False)]
    rows = decision_rows_drawn(at)
    assert list(rows) == list(expected["request"])
    for rid, verdict in zip(expected["request"], expected["verdict"], strict=True):
        style, link = rows[rid]
        assert link == inspector_link(rid)
        assert (VERDICT_COLOURS[verdict] in style) if verdict in VERDICT_COLOURS else not style
    assert VERDICT_COLOURS["false_hit"] in rows[db.false_hit_id][0]


def test_routing_misses_only_keeps_the_misses(db: Recorded) -> None:
    at = open_page("routing")
    at.toggle(key="routing_misses_only").set_value(True).run()
    assert_clean(at)
    shown = drawn_decisions(at)
    assert db.false_hit_id in set(shown["request"]) and db.hit_id not in set(shown["request"])
    assert set(shown["verdict"]) <= set(MISS_VERDICTS)


def test_inspector_routing_section_lists_candidates(db: Recorded) -> None:
    at = open_page("inspector", {"request": db.hit_id})
    assert_clean(at)
    candidates = next(d for d in frames(at) if "chosen" in d.columns)
    assert list(candidates["worker"]) == ["w1", "w2"]
    assert list(candidates["load"]) == [2.0, 0.0]
    scores = next(d for d in frames(at) if "device blocks" in d.columns)
    assert list(scores["source"]) == ["policy_affinity", "expected_wait", "expected_wait"]
    assert any("cache_aware / policy" in c.value for c in at.caption)
    at = open_page("inspector", {"request": db.drift_id})
    assert any("No candidates reported" in c.value for c in at.caption)


def test_affinity_sankey_counts_requests_per_image(db: Recorded) -> None:
    at = open_page("affinity")
    assert_clean(at)
    assert not figures(at)  # the Sankey is inline SVG: the page loads no Plotly code
    sankey = sankey_drawn(at)
    # 5 successful traces, one with two images → 6 image→worker requests.
    assert sum(sankey["value"]) == 6
    assert {"w1", "w2"} <= set(sankey["nodes"]) and set(sankey["target"]) <= {"w1", "w2"}
    assert all(h.startswith("image ") and "request(s)" in h for h in sankey["hover"])
    assert any("more than one worker" in w for w in messages(at)["warning"])


def test_cache_page_figures(db: Recorded) -> None:
    at = open_page("cache")
    assert_clean(at)
    assert not figures(at)  # every chart is SVG: a new tab of the Cache page loads no Plotly
    hit = lines_titled(at, "hit rate per worker")
    assert sorted(trace_names(hit)) == ["w1", "w2"]  # the config's names
    assert max(y for y in hit["data"][0]["y"] if y is not None) == pytest.approx(0.4)
    timeline = svg_bars(at, "KV events")
    assert "w1 stored (12)" in timeline["series"]
    assert "w1 removed (0)" in timeline["series"]
    assert sum(y for y, s in zip(timeline["y"], timeline["series"], strict=True)
               if s == "w1 stored (12)") == 12
    resident = svg_bars(at, "Resident blocks")
    assert [y for s, y in zip(resident["series"], resident["y"], strict=True)
            if s == "resident blocks"] == [12, 5]
    tree = icicle_drawn(chart_markup(at, "Prefix tree"))
    # The chained event (parent 1004) hangs under block 1004 of its worker.
    assert tree["parents"][tree["ids"].index(f"{W1}/9001")] == f"{W1}/1004"
    rates = lines_titled(at, "Achieved vs available")
    assert sorted(trace_names(rates)) == ["smg · achieved", "smg · available"]  # by name
    assert [t["dash"] for t in rates["data"]] == [None, "6 4"]  # available is dashed
    (lost,) = [d for d in frames(at) if "avoidable" in d.columns
               and "request" in d.columns]
    row = lost[lost["request"] == db.false_hit_id].iloc[0]
    assert row["false hit"] == "80 (content_blind)" and row["avoidable"] == 0
    scatter = lines_titled(at, "Predicted vs realized")
    (points,) = [t for t in scatter["data"] if db.false_hit_id in t["ids"]]
    i = points["ids"].index(db.false_hit_id)
    assert (points["x"][i], points["y"][i]) == (80, 0)
    assert points["links"][i] == f"inspector?request={db.false_hit_id}"
    # The zoomable tree is Plotly's, one toggle away.
    at.toggle(key="tree_zoom").set_value(True).run()
    plotly_tree = figure_titled(at, "Prefix tree")["data"][0]
    assert plotly_tree["type"] == "icicle" and f"{W1}/9001" in plotly_tree["ids"]


def test_lab_page_lists_router_model_and_sequences(db: Recorded) -> None:
    at = open_page("lab")
    assert_clean(at)
    assert at.selectbox(key="lab_router").value == "smg"
    assert at.selectbox(key="lab_model").value == "Qwen/Qwen3-VL-2B-Instruct"
    options = at.selectbox(key="lab_sequence").options
    assert any("A and B at once" in o for o in options)
    assert any(o.startswith("scenario isolation") for o in options)
    assert not at.button(key="lab_send").disabled


@pytest.mark.parametrize(("key", "value", "says", "good"), [
    ("lab_size", "abc", "not an image size WxH: 'abc'", "640x480"),
    ("lab_size", "0x0", "image width must be positive, got 0", "640x480"),
    ("lab_url", "not a url", "not an image URL: 'not a url'", ""),
    ("lab_layout_model", "no-such-model", "unknown layout model 'no-such-model'", "qwen3-vl"),
])
def test_lab_bad_input_gets_an_inline_error_and_keeps_the_controls(
        db: Recorded, key: str, value: str, says: str, good: str) -> None:
    at = open_page("lab")
    at.text_input(key=key).set_value(value).run()
    assert_clean(at)  # and page_guard caught nothing: the page checked the input itself
    (error,) = messages(at)["error"]
    assert says in error
    assert at.button(key="lab_send").disabled  # still there, not pressable
    for widget in ("lab_size", "lab_url", "lab_layout_model", "lab_text"):
        assert at.get_by_key(widget) is not None
    at.text_input(key=key).set_value(good).run()
    assert not messages(at)["error"] and not at.button(key="lab_send").disabled


def test_targets_page_validates_toml(db: Recorded, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "mmlens.toml"
    cfg.write_text('[[router]]\nname = "smg"\nkind = "smg"\nurl = "http://127.0.0.1:30000"\n')
    monkeypatch.setenv("MMLENS_CONFIG", str(cfg))
    at = open_page("targets")
    assert_clean(at)
    assert any("1 router(s)" in s for s in messages(at)["success"])
    at.text_area(key="targets_toml").set_value(
        at.text_area(key="targets_toml").value + 'api_key = "sk-secret"\n').run()
    assert any("secrets come from environment variables" in e for e in messages(at)["error"])
    at.text_area(key="targets_toml").set_value("[[router]\n").run()
    assert any("TOML syntax" in e for e in messages(at)["error"])
    assert_clean(at)
    # A bad address: named with its line, and Save stays on the page (not pressable).
    bad = cfg.read_text() + '\n[[router]]\nname = "two"\nkind = "smg"\nurl = "not a url"\n'
    at.text_area(key="targets_toml").set_value(bad).run()
    (error,) = messages(at)["error"]
    assert "router[1].url" in error and 'line 9: `url = "not a url"`' in error
    assert at.button(key="targets_save").disabled
    # Fixed, it can be saved; the file changes (the running collector rereads it).
    good = bad.replace("not a url", "http://127.0.0.1:30002")
    at.text_area(key="targets_toml").set_value(good).run()
    assert not messages(at)["error"] and not at.button(key="targets_save").disabled
    at.button(key="targets_save").click().run()
    assert cfg.read_text() == good
    assert any("apply it within a few seconds" in s for s in messages(at)["success"])


@pytest.mark.parametrize("page", PAGES)
def test_no_store_configured(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MMLENS_DB", raising=False)
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    at = open_page(page)
    assert_clean(at)
    if page not in ("inspector", "targets"):
        assert any("No store configured" in i for i in messages(at)["info"])


@pytest.mark.parametrize("page", PAGES)
def test_store_not_created_yet(page: str, store_db: str,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMLENS_DB", store_db)  # no file yet; an empty database
    at = open_page(page)
    assert_clean(at)
    if page not in ("inspector", "targets"):
        assert any("No data yet" in i for i in messages(at)["info"])


@pytest.mark.parametrize("page", PAGES)
def test_empty_store_gives_clear_states(page: str, store_db: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    open_store(store_db).close()
    monkeypatch.setenv("MMLENS_DB", store_db)
    at = open_page(page)
    assert_clean(at)
    assert not figures(at) or page == "inspector"
    if page in ("overview", "affinity", "lab"):
        assert messages(at)["info"], f"{page} says nothing on an empty store"


def test_router_down_and_no_metrics_are_named(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from mmlens.records import CollectorHealth

    path = tmp_path / "down.db"
    store = Store(path)
    h = CollectorHealth("router_state", "smg")
    h.error("unreachable", "connection refused", time.time())
    store.set_health([h])
    store.set_meta("targets", {"routers": [{"name": "smg", "kind": "smg",
                                            "url": "http://127.0.0.1:9"}], "prometheus": None})
    store.set_meta("router_state", [{"router": "smg", "kind": "smg", "url": "http://127.0.0.1:9",
                                     "models": []}])
    store.close()
    monkeypatch.setenv("MMLENS_DB", str(path))
    at = open_page("overview")
    assert_clean(at)
    text = messages(at)
    assert any("Router smg is down" in e for e in text["error"])
    assert any("No metrics scraped yet" in w for w in text["warning"])
    assert frames(at)[0].iloc[0]["state"] == "down"
    at = open_page("lab")
    assert_clean(at)
    assert at.text_input(key="lab_model_text") is not None  # no model list from a dead router


def test_overview_shows_collector_shards_and_names_missing_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmlens.records import CollectorHealth

    now = time.time()
    path = tmp_path / "shards.db"
    store = Store(path)
    store.set_health([CollectorHealth("shard", "0/3", last_success=now - 1, counters={
        "workers": 340, "fleet_workers": 1000, "kv_endpoints": 340, "kv_events": 12345}),
        CollectorHealth("shard", "1/3", last_success=now - 90, counters={
            "workers": 331, "fleet_workers": 1000, "kv_endpoints": 331, "kv_events": 7})], now,
        "host-a:1")
    # Shard 0/3 restarted: its old process's row stays behind, the newest one counts.
    store.set_health([CollectorHealth("shard", "0/3", last_success=now - 600)], now - 600,
                     "host-b:1")
    store.close()
    monkeypatch.setenv("MMLENS_DB", str(path))
    at = open_page("overview")
    assert_clean(at)
    errors = messages(at)["error"]
    assert any("shard_missing" in e and "2/3" in e for e in errors)
    assert any("shard_stale" in e and "1/3" in e and "331 workers" in e for e in errors)
    (table,) = [d for d in frames(at) if "shard" in d.columns]
    assert list(table["shard"]) == ["0/3", "1/3"]
    assert list(table["state"]) == ["ok", "stale"]
    assert list(table["KV events stored"]) == [12345, 7]


def test_overview_shows_a_store_outage_as_a_banner(tmp_path: Path, monkeypatch) -> None:
    from mmlens.records import CollectorHealth

    path = tmp_path / "outage.db"
    store = Store(path)
    try:
        store.set_health([CollectorHealth("store", "outage", last_error="store_down: "
                                          "OperationalError: the connection is lost",
                                          counters={"down": 1, "backlog_records": 4321,
                                                    "spilled_backlog_records": 321})],
                         time.time(), "collector-a")
    finally:
        store.close()
    monkeypatch.setenv("MMLENS_DB", str(path))
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    at = open_page("overview")
    assert_clean(at)
    (banner,) = [m for m in messages(at)["error"] if "store was unreachable" in m]
    assert "collector-a: 4321 records held (321 spilled" in banner


def test_inspector_draws_its_layout_without_plotly_and_zooms_on_request(db: Recorded) -> None:
    """The layout is inline SVG (a new tab's first click waits for no Plotly code); the
    toggle draws the same series as the zoomable Plotly figure."""
    at = open_page("inspector", {"request": db.hit_id})
    assert not figures(at)
    drawn = trace_names(layout_drawn(at))
    at.toggle(key="layout_zoom").set_value(True).run()
    assert_clean(at)
    zoomable = [n for n in trace_names(figures(at)[0]) if n != "blocks"]
    assert [n for n in drawn if n != "blocks"] == zoomable
