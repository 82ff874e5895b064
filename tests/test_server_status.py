"""``GET /v1/stagewise/status`` and the web page's routes: the plan read back, rates from snapshots,
the API key and ``--no-webui`` (the page in a real browser: test_webui_browser.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from stagewise.engine.demo_model import DEMO_CONTEXT, DEMO_DEVICES, ensure_demo_model
from stagewise.engine.metrics import EngineMetrics
from stagewise.engine.metrics_snapshot import MetricsSnapshot, Timing, snapshot_of
from stagewise.server.app import guarded_app
from stagewise.server.live_window import LiveWindow
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from stagewise.server.webui import webui_files
from tests.test_server_support import REPO, ServedModel, serving, start_demo


def _snap(time_s: float, generated: int, prefilled: int, step: Timing) -> MetricsSnapshot:
    return MetricsSnapshot(time_s, 1, 0, 0, 0, prefilled, generated, 0, Timing(0.0, 0), (3,), (16,), (0,),
                           (step,), ())


def test_window_rates_over_the_last_second() -> None:
    window = LiveWindow(window_s=1.0)
    first = window.add(_snap(10.0, 0, 0, Timing(0.0, 0)))
    assert first["decode_tokens_per_s"] is None and first["stage_step_s"] == [None]
    mid = window.add(_snap(10.5, 50, 100, Timing(0.5, 50)))  # no snapshot a second old yet: the oldest
    assert mid["interval_s"] == pytest.approx(0.5) and mid["decode_tokens_per_s"] == pytest.approx(100)
    late = window.add(_snap(11.5, 250, 100, Timing(2.5, 250)))  # base: 10.5, the newest one >= 1 s old
    assert late["interval_s"] == pytest.approx(1.0)
    assert late["decode_tokens_per_s"] == pytest.approx(200) and late["prefill_tokens_per_s"] == 0
    assert late["stage_step_s"] == [pytest.approx(0.01)] and late["stage_steps_per_s"] == [pytest.approx(200)]


def test_snapshot_reads_the_prometheus_series() -> None:
    m = EngineMetrics()
    m.generation_tokens.inc(7)
    m.prefill_tokens.inc(30)
    m.requests.labels("stop").inc()
    m.requests.labels("length").inc(2)
    m.queue_depth.set(4)
    m.stage_kv_blocks_in_use.labels("1", "cpu:1").set(5)
    m.stage_step.labels("0", "cpu:0").observe(0.25)
    m.stage_step.labels("0", "cpu:0").observe(0.75)
    m.handoff.labels("0->1").observe(0.5)
    snap = snapshot_of(m.registry.collect(), stages=2)
    assert (snap.generation_tokens_total, snap.prefill_tokens_total, snap.requests_total, snap.waiting) == (7, 30, 3, 4)
    assert snap.kv_blocks_in_use == (0, 5)
    assert snap.stage_step == (Timing(1.0, 2), Timing(0.0, 0)) and snap.handoff == (Timing(0.5, 1),)


@pytest.fixture
def loading_app() -> Iterator[TestClient]:
    """The app of a server still loading its model, with an API key."""
    with TestClient(guarded_app(ServerState(ServeSettings(api_key="sekret")))) as http:
        yield http


def test_page_is_open_status_asks_for_the_key(loading_app: TestClient) -> None:
    page = loading_app.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert loading_app.get("/webui/main.js").headers["content-type"].startswith("text/javascript")
    assert loading_app.get("/webui/nothing.js").status_code == 404
    head = loading_app.head("/")
    assert head.status_code == 200 and head.content == b"" and head.headers["content-type"].startswith("text/html")
    assert loading_app.head("/webui/main.js").status_code == 200
    assert loading_app.get("/v1/stagewise/status").status_code == 401
    status = loading_app.get("/v1/stagewise/status", headers={"Authorization": "Bearer sekret"})
    assert status.status_code == 200
    assert status.json() == {"object": "stagewise.status", "phase": "loading", "model": None, "placement": None,
                             "live": None}


def test_no_webui_serves_no_page() -> None:
    with TestClient(guarded_app(ServerState(ServeSettings(webui=False)))) as http:
        assert http.get("/").status_code == 404
        assert http.get("/webui/main.js").status_code == 404
        assert http.get("/v1/stagewise/status").status_code == 200


def test_page_is_small_and_self_contained() -> None:
    files = webui_files()
    assert {"index.html", "main.js", "api.js", "chat.js", "live.js", "placement.js", "style.css"} <= set(files)
    assert sum(len(body) for body in files.values()) < 300_000
    for name, body in files.items():
        text = body.decode()
        assert "http://" not in text and "https://" not in text, f"{name} refers to another origin"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    served = start_demo(tmp_path_factory.mktemp("status") / "serve.log")
    with serving(served):
        yield served


def plan_of_demo() -> dict:
    """``stagewise plan --json`` of the demo model on the devices ``make demo`` serves it on."""
    out = subprocess.run([sys.executable, "-m", "stagewise", "plan", str(ensure_demo_model()), "--devices",
                          DEMO_DEVICES, "--context", str(DEMO_CONTEXT), "--batch", "2", "--json"],
                         cwd=REPO, capture_output=True, text=True, check=True, timeout=120)
    return dict(json.loads(out.stdout))


def test_status_is_the_certified_plan(demo: ServedModel) -> None:
    status = httpx.get(f"{demo.url}/v1/stagewise/status", timeout=10).json()
    plan = plan_of_demo()
    placement = status["placement"]
    assert status["phase"] == "ready" and status["model"] == "demo"
    assert placement["fingerprint"] == plan["fingerprint"]
    assert [s["blocks"] for s in placement["stages"]] == [s["blocks"] for s in plan["stages"]] == [[0, 2], [2, 4]]
    assert [s["planned"] for s in placement["stages"]] == [s["charge"] for s in plan["stages"]]
    for stage in placement["stages"]:
        measured = stage["measured"]
        assert measured["weights_bytes"] == stage["planned"]["weights_bytes"]  # f32 weights: exact
        assert measured["total_bytes"] == measured["weights_bytes"] + measured["state_bytes"]
    assert [d["id"] for d in placement["devices"]] == ["cpu:0", "cpu:1"]
    assert placement["links"][0]["between"] == ["cpu:0", "cpu:1"] and placement["links"][0]["boundary"]


def _status_seconds(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(next(line.split()[1] for line in text.splitlines()
                      if line.startswith("stagewise_status_seconds_total ")))


def test_status_time_is_counted(demo: ServedModel) -> None:
    """Each status body's build time is added to ``stagewise_status_seconds_total`` (the serving bench's
    measure of what the page costs the engine loop)."""
    before = _status_seconds(demo.url)
    for _ in range(3):
        httpx.get(f"{demo.url}/v1/stagewise/status", timeout=10).raise_for_status()
    assert _status_seconds(demo.url) > before


def test_status_counters_move_with_a_request(demo: ServedModel) -> None:
    before = httpx.get(f"{demo.url}/v1/stagewise/status", timeout=10).json()["live"]
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "temperature": 0}
    r = httpx.post(f"{demo.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    after = httpx.get(f"{demo.url}/v1/stagewise/status", timeout=10).json()["live"]
    tokens = r.json()["usage"]
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == tokens["completion_tokens"]
    assert after["prefill_tokens_total"] - before["prefill_tokens_total"] == tokens["prompt_tokens"]
    assert after["requests_total"] == before["requests_total"] + 1
    assert all(s["steps_total"] > b["steps_total"] for s, b in zip(after["stages"], before["stages"], strict=True))
    assert after["handoffs"][0]["handoffs_total"] > before["handoffs"][0]["handoffs_total"]


def test_status_of_stages_in_worker_processes(tmp_path: Path) -> None:
    served = start_demo(tmp_path / "workers.log", "--workers", "local")
    try:
        served.wait_ready(120)
        r = httpx.post(f"{served.url}/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        status = httpx.get(f"{served.url}/v1/stagewise/status", timeout=10).json()
        stages = status["placement"]["stages"]
        assert [s["blocks"] for s in stages] == [[0, 2], [2, 4]]
        for stage in stages:  # a worker reports its stage's total; the split stays the plan's
            assert stage["measured"]["weights_bytes"] is None and stage["measured"]["total_bytes"] > 0
        assert all(s["steps_total"] >= 4 for s in status["live"]["stages"])
    finally:
        assert served.stop() == 0, served.log.read_text()[-3000:]
