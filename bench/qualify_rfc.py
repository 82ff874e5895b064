"""The RFC's experiment through the product's ordinary paths: make, assess, serve, exercise, bench.

1. ``stagewise make-model`` writes a random-weight GGUF in the exact Qwen3.6-35B-A3B geometry (Q8_0,
   F32 small tensors) unless it exists;
2. ``stagewise assess`` on one capped GPU and on both (the RFC's legal budgets);
3. ``stagewise serve`` on both capped GPUs (peak host RSS of the server process recorded from
   /proc), then over HTTP: two fresh temperature-0 requests, a streamed request (time to first
   token, decode rate), a long prompt (prefill rate), a cancelled stream (state freed per
   /metrics), an injected failed step (500, then recovery with identical output), a request
   queued behind another, and SIGTERM with a request in flight (drained, exit 0);
4. ``stagewise bench`` on the same file and budgets (prefill / decode tokens/s, handoff median).

    python bench/qualify_rfc.py --gguf /tmp/q36.gguf --out bench/results/qualification_2xh200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

DEVICES = "cuda:0@22.760GB,cuda:1@22.766GB"  # the RFC's legal budgets; --devices overrides
CLI = [sys.executable, "-m", "stagewise"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli_json(*argv: str) -> Any:
    proc = subprocess.run([*CLI, *argv, "--json"], capture_output=True, text=True, timeout=600)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"rc": proc.returncode, "stdout": proc.stdout[-2000:], "stderr": proc.stderr[-2000:]}


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _chat(client: httpx.Client, content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **extra}
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body, timeout=600)
    try:
        parsed = r.json()
    except ValueError:
        parsed = {"error": {"message": r.text[:2000]}}
        print("non-JSON response", r.status_code, r.text[:500], flush=True)
    return {"status": r.status_code, "s": time.perf_counter() - t0, "body": parsed}


def _stream(client: httpx.Client, content: str, max_tokens: int, stop_after: int | None = None) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    with client.stream("POST", "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            if event.get("choices") and event["choices"][0]["delta"].get("content") is not None:
                chunks += 1
                if first is None:
                    first = time.perf_counter() - t0
            if stop_after is not None and chunks >= stop_after:
                break  # closing the stream disconnects the client
    total = time.perf_counter() - t0
    return {"ttft_s": first, "total_s": total, "chunks": chunks, "usage": usage}


def _metric(client: httpx.Client, name: str) -> float | None:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def serve_and_exercise(gguf: str, report: dict[str, Any], devices: str, context: int) -> None:
    port = _free_port()
    env = {**os.environ, "STAGEWISE_FAULT_INJECTION": "1", "PYTHONUNBUFFERED": "1"}
    log = open("/tmp/serve.log", "w")
    server = subprocess.Popen([*CLI, "serve", gguf, "--devices", devices, "--port", str(port), "--context", str(context),
                               "--grace-s", "60"], stdout=log, stderr=subprocess.STDOUT, env=env)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
    t0 = time.perf_counter()
    rss_at_start = None
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"server exited: {Path('/tmp/serve.log').read_text()[-3000:]}")
        try:
            code = client.get("/health", timeout=5).status_code
        except httpx.HTTPError:
            code = 0
        if code and rss_at_start is None:
            rss_at_start = _status(server.pid)["VmRSS"]  # HTTP up, weights not loaded yet
        if code == 200:
            break
        time.sleep(0.5)
    status = _status(server.pid)
    warmed = re.search(r"warmed up in ([0-9.]+) s", Path("/tmp/serve.log").read_text())
    report["load"] = {"seconds": time.perf_counter() - t0,  # until /health is 200: the warm-up included
                      "warm_up_s": float(warmed.group(1)) if warmed else None, "rss_before_load_bytes": rss_at_start,
                      "peak_rss_bytes": status["VmHWM"], "rss_after_load_bytes": status["VmRSS"],
                      "peak_rss_growth_bytes": status["VmHWM"] - (rss_at_start or 0)}
    prompt = "Tell me about pipelines across two GPUs."
    a = _chat(client, prompt, 16, logprobs=True)
    b = _chat(client, prompt, 16, logprobs=True)
    if a["status"] != 200:
        raise RuntimeError(f"chat request failed: {a['status']} {a['body']}")
    # the random model's tokens past the demo vocabulary print as "", so compare (text, logprob) pairs
    toks = [[(t["token"], t["logprob"]) for t in r["body"]["choices"][0]["logprobs"]["content"]] for r in (a, b)]
    report["determinism"] = {"same_tokens": toks[0] == toks[1], "tokens": toks[0], "first_s": a["s"], "second_s": b["s"]}
    report["stream"] = _stream(client, prompt, 64)
    u = report["stream"]["usage"] or {}
    if u and report["stream"]["ttft_s"]:
        gen = u.get("completion_tokens", 0)
        report["stream"]["decode_tokens_per_s"] = (gen - 1) / (report["stream"]["total_s"] - report["stream"]["ttft_s"])
    long_prompt = " ".join(["pipeline stage handoff"] * max(4, min(300, context // 16)))  # fits the context
    p = _chat(client, long_prompt, 1)
    pt = p["body"].get("usage", {}).get("prompt_tokens", 0)
    report["prefill"] = {"prompt_tokens": pt, "seconds": p["s"], "tokens_per_s": pt / p["s"] if p["s"] else None}
    # cancellation mid-stream frees the state slot
    report["cancel"] = _stream(client, prompt, 200, stop_after=3)
    deadline = time.time() + 30
    slots = _metric(client, "stagewise_state_slots_in_use")
    while slots and time.time() < deadline:
        time.sleep(0.2)
        slots = _metric(client, "stagewise_state_slots_in_use")
    report["cancel"]["slots_in_use_after"] = slots
    # an injected failure in stage 1 fails only that request; the next one is unaffected
    armed = client.post("/debug/fail-next-step", json={"stage": 1})  # the second GPU's stage
    if armed.status_code != 200:
        armed = client.post("/debug/fail-next-step", json={"stage": 0})
    failed = _chat(client, prompt, 16)
    again = _chat(client, prompt, 16, logprobs=True)
    again_toks = ([(t["token"], t["logprob"]) for t in again["body"]["choices"][0]["logprobs"]["content"]]
                  if again["status"] == 200 else None)
    report["injected_failure"] = {"armed": armed.json(), "failed_status": failed["status"], "failed_error": failed["body"].get("error"),
                                  "next_status": again["status"], "next_same_tokens": again_toks == toks[0]}
    # a second request arriving while one runs waits in the queue, then is served
    results: dict[str, Any] = {}

    def long_request() -> None:
        results["first"] = _stream(client, prompt, 128)

    client.post("/debug/step-delay", json={"seconds": 0.02})  # keep the first request running meanwhile
    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.5)
    seen: dict[str, Any] = {}

    def watch() -> None:  # the queue depth while the second request waits
        deadline = time.time() + 10
        while time.time() < deadline and not seen.get("depth"):
            seen["depth"] = _metric(client, "stagewise_queue_depth")
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    second = _chat(client, "A short one.", 8)
    t.join()
    watcher.join()
    queued_depth = seen.get("depth")
    client.post("/debug/step-delay", json={"seconds": 0.0})
    report["queued"] = {"first_total_s": results["first"]["total_s"], "second_status": second["status"],
                        "second_total_s": second["s"], "queue_depth_seen": queued_depth}
    # graceful shutdown with a request in flight
    inflight: dict[str, Any] = {}
    t = threading.Thread(target=lambda: inflight.update(_stream(client, prompt, 64)))
    t.start()
    time.sleep(1.0)
    t_sig = time.perf_counter()
    server.send_signal(signal.SIGTERM)
    rc = server.wait(timeout=120)
    t.join(timeout=60)
    report["shutdown"] = {"exit_code": rc, "seconds": time.perf_counter() - t_sig,
                          "inflight_chunks": inflight.get("chunks"), "inflight_usage": inflight.get("usage")}
    log.close()
    report["serve_log_tail"] = Path("/tmp/serve.log").read_text()[-4000:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/qwen3.6-35b-a3b-q8_0.gguf")
    ap.add_argument("--out", default="bench/results/qualification_2xh200.json")
    ap.add_argument("--skip", default="", help="comma list of steps to skip: make,assess,serve,bench")
    ap.add_argument("--devices", default=DEVICES)
    ap.add_argument("--one-device", default="cuda:0@22.760GB")
    ap.add_argument("--preset", default="qwen3.6-35b-a3b")
    ap.add_argument("--make-device", default="cuda")
    ap.add_argument("--context", type=int, default=4096)
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    report: dict[str, Any] = {"command": "python " + " ".join(sys.argv),
                              "date": datetime.datetime.now(datetime.UTC).isoformat(), "devices": args.devices}
    if "make" not in skip and not Path(args.gguf).exists():
        t0 = time.perf_counter()
        subprocess.run([*CLI, "make-model", "--config", args.preset, "--format", "gguf", "--dtype", "q8_0",
                        "--seed", "0", "--device", args.make_device, args.gguf], check=True, timeout=900)
        report["make_model_s"] = time.perf_counter() - t0
    report["gguf_bytes"] = Path(args.gguf).stat().st_size
    if "assess" not in skip:
        report["assess_one_gpu"] = _cli_json("assess", args.gguf, "--devices", args.one_device, "--context", str(args.context))
        report["assess_two_gpus"] = _cli_json("assess", args.gguf, "--devices", args.devices, "--context", str(args.context))
        print("assess:", report["assess_one_gpu"].get("outcome"), report["assess_one_gpu"].get("deficit_bytes"),
              "|", report["assess_two_gpus"].get("outcome"), flush=True)
    if "serve" not in skip:
        try:
            serve_and_exercise(args.gguf, report, args.devices, args.context)
        except Exception as exc:  # record and go on to the bench
            report["serve_error"] = repr(exc)
        print("serve:", {k: report.get(k) for k in ("load", "determinism", "stream", "prefill", "cancel",
                                                     "injected_failure", "queued", "shutdown", "serve_error")},
              flush=True)
        if report.get("serve_error"):
            print(Path("/tmp/serve.log").read_text()[-3000:], flush=True)
    if "bench" not in skip:
        prompt = min(512, args.context // 2)
        report["bench"] = _cli_json("bench", args.gguf, "--devices", args.devices, "--prompt", str(prompt),
                                    "--gen", str(min(64, args.context // 4)), "--repeats", "2", "--placement", "pipeline:2",
                                    "--context", str(args.context))
        b = report["bench"].get("stagewise", {})
        print("bench:", {k: b.get(k) for k in ("prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s",
                                                "handoff_s_per_token", "stage_step_s")}, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
