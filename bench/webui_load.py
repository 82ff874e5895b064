"""The web page's weight and load time from a loopback server, and the status endpoint's latency.

    python bench/webui_load.py [--loads 20] [--polls 300] [--json bench/results/webui_load_cpu.json]

Starts ``stagewise serve`` of the demo model (two virtual CPU devices, as ``make demo``), then with
Debian's chromium (headless, through Playwright; a fresh browser context, so an empty cache, per load):
``load_ms`` (navigation start to the load event: the HTML, CSS and the five scripts) and
``first_status_ms`` (to the first status rendered: the placement on screen), p50 and max over
``--loads``; the page's weight (bytes of every file it fetched, as served: no compression). Then
``GET /v1/stagewise/status`` ``--polls`` times over loopback, idle and while 2 streams decode: p50/p99
latency at the client; and, in this process on the demo model once the server has stopped, the
time one status body takes to build (``StatusReport.body``: what a read holds the GIL for, which the
engine's thread then waits on).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.test_server_support import start_demo  # noqa: E402
from tests.test_webui_browser import CHROMIUM, FLAGS  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _page_loads(url: str, loads: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    load_ms, first_ms, weights = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        for _ in range(loads):
            context = browser.new_context()  # empty cache
            page = context.new_page()
            fetched: dict[str, int] = {}
            page.on("requestfinished", lambda r, fetched=fetched: fetched.__setitem__(r.url, r.sizes()["responseBodySize"]))
            page.goto(url + "/", wait_until="load")
            page.wait_for_selector("#stages tbody tr.stage", timeout=60_000)
            nav = page.evaluate("performance.getEntriesByType('navigation')[0].toJSON()")
            first = page.evaluate("performance.getEntriesByName('stagewise:first-status')[0].startTime")
            load_ms.append(nav["loadEventEnd"] - nav["startTime"])
            first_ms.append(first)
            weights.append(sum(size for u, size in fetched.items() if "/v1/" not in u))
            context.close()
        browser.close()
    return {"loads": loads, "load_ms_p50": statistics.median(load_ms), "load_ms_max": max(load_ms),
            "first_status_ms_p50": statistics.median(first_ms), "first_status_ms_max": max(first_ms),
            "page_bytes": max(weights), "files": sum("/v1/" not in u for u in fetched)}


def _status_latency(url: str, polls: int) -> dict[str, float]:
    out = []
    with httpx.Client(base_url=url, timeout=10) as http:
        http.get("/v1/stagewise/status")
        for _ in range(polls):
            t0 = time.perf_counter()
            r = http.get("/v1/stagewise/status")
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200
    return {"p50_ms": _pct(out, 50) * 1e3, "p99_ms": _pct(out, 99) * 1e3, "polls": polls}


def _read_cost_us(reads: int) -> dict[str, float]:
    """Microseconds per ``StatusReport.body()`` (and with ``json.dumps``) on the demo model, in process."""
    from stagewise.engine.engine import Engine
    from stagewise.engine.model_loading import load_model
    from stagewise.server.serve_settings import ServeSettings
    from stagewise.server.server_state import ServerState
    from stagewise.server.status_report import StatusReport

    model = load_model(None, max_seqs=None)  # as `stagewise serve` loads the demo
    state = ServerState(ServeSettings())
    state.set_ready(model, Engine(model, 16, state.metrics))
    report = StatusReport(state)
    report.body()  # the placement view, built once
    out = {}
    for name, build in (("body_us", report.body), ("body_and_json_us", lambda: json.dumps(report.body()))):
        t0 = time.perf_counter()
        for _ in range(reads):
            build()
        out[name] = (time.perf_counter() - t0) / reads * 1e6
    model.close()
    return out


def _streams(url: str, count: int, stop: threading.Event) -> list[threading.Thread]:
    def run() -> None:
        body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 400, "temperature": 0.8}
        while not stop.is_set():
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", type=int, default=20)
    p.add_argument("--polls", type=int, default=300)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    log = Path(tempfile.mkstemp(prefix="webui_load_", suffix=".log")[1])
    served = start_demo(log)
    try:
        served.wait_ready()
        page = _page_loads(served.url, args.loads)
        idle = _status_latency(served.url, args.polls)
        stop = threading.Event()
        threads = _streams(served.url, 2, stop)
        time.sleep(1.0)  # the streams are decoding
        busy = _status_latency(served.url, args.polls)
        stop.set()
        for t in threads:
            t.join(120)
    finally:
        served.stop()
    read_cost = _read_cost_us(2000)
    files = sorted((REPO / "stagewise" / "assets" / "webui").iterdir())
    result = {"command": " ".join(["python3", *sys.argv]), "machine": platform.node(), "cpus": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d %H:%M"), "load_average": os.getloadavg(), "browser": CHROMIUM, "page": page,
              "packaged_bytes": {f.name: f.stat().st_size for f in files},
              "status_idle": idle, "status_while_2_streams_decode": busy, "status_read_in_process": read_cost}
    print("load ms p50 | load ms max | first status ms p50 | page bytes | status p50/p99 ms idle | busy | body us")
    print(f"{page['load_ms_p50']:.1f} | {page['load_ms_max']:.1f} | {page['first_status_ms_p50']:.1f} | "
          f"{page['page_bytes']} | {idle['p50_ms']:.2f}/{idle['p99_ms']:.2f} | {busy['p50_ms']:.2f}/{busy['p99_ms']:.2f}"
          f" | {read_cost['body_us']:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
