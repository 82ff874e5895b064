"""Load benchmark over HTTP: a real ``stagewise serve`` process driven by the ``openai`` client's streaming.

    python bench/serve_load.py [--model] MODEL [--devices D] [--placement P] [--max-seqs N] [--queue N]
        [--concurrency 1,8,32,64,128] [--rate R --requests M] [--prompt 208] [--gen 128]
        [--json bench/results/OUT.json]

``MODEL`` is what ``stagewise serve`` takes (a directory, a GGUF file, ``random:PRESET``), or ``demo``
for the built-in demo model. For each concurrency level N, N streamed ``/v1/completions`` requests
(prompts of exactly ``--prompt`` token ids, ``--gen`` tokens out, greedy) are sent at once; with
``--rate``, ``--requests`` more arrive as a Poisson process of that rate. Reported per run, as
``vllm bench serve`` reports them: completed, refused (429), failed, output tok/s (every streamed
token over the run's wall time), decode tok/s (each stream's tokens after its first over its time after
its first, summed: the prefill's share left out), TTFT p50/p99, inter-token latency p50/p99 (every gap between two
streamed tokens), end-to-end latency p50/p99. The first run after the server came up is marked
``first_burst`` (its TTFT includes whatever warm-up did not cover). With ``--status-poll-s S`` each
level runs a second time while ``GET /v1/stagewise/status`` is polled every S seconds (the web page
polls every 1 s), in ``--status-rounds`` rounds of unpolled, polled, polled, unpolled: the polled runs'
output tok/s over the unpolled ones' (``status_on_over_off``, and each round's) and the polls'
latency (p50/p99/max at the client) and the server's own time building them
(``stagewise_status_seconds_total``: ms per poll, and ms per second of the run: what they took from the
engine loop at most, which waits for the GIL meanwhile). Then, with the server stopped
(its devices freed), ``stagewise bench MODEL --concurrency LEVELS`` runs in process on the same
devices and its aggregate and decode tok/s are written beside the HTTP figures with their ratio.
JSON (command, machine, date, both sets of figures) goes to ``--json``; a table is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Trace:
    """One request's timeline (seconds from its own send) and outcome."""

    status: str = "pending"  # completed | refused | failed
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)  # between consecutive streamed tokens
    e2e_s: float | None = None
    tokens: int = 0
    error: str | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def _one(client: openai.AsyncOpenAI, prompt: list[int], gen: int, trace: Trace) -> None:
    """One streamed request: TTFT and gaps from the chunks that carry text, the token count from the
    final usage chunk (a random tokenizer's tokens often decode to no text, so chunks undercount them)."""
    t0 = time.perf_counter()
    last = None
    chunks = 0
    try:
        stream = await client.completions.create(model=client.served_model, prompt=prompt, max_tokens=gen,  # type: ignore[attr-defined]
                                                 temperature=0, stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.usage is not None:
                trace.tokens = chunk.usage.completion_tokens
            if not chunk.choices or not chunk.choices[0].text:
                continue
            now = time.perf_counter()
            if last is None:
                trace.ttft_s = now - t0
            else:
                trace.gaps_s.append(now - last)
            last = now
            chunks += 1
        trace.tokens = trace.tokens or chunks
        trace.e2e_s = time.perf_counter() - t0
        trace.status = "completed"
    except openai.RateLimitError:
        trace.status = "refused"
    except Exception as exc:  # a benchmark reports failures, it does not stop at the first
        trace.status, trace.error = "failed", f"{type(exc).__name__}: {exc}"


def _summary(name: str, traces: list[Trace], wall_s: float, first_burst: bool) -> dict[str, Any]:
    done = [t for t in traces if t.status == "completed"]
    ttft = [t.ttft_s for t in done if t.ttft_s is not None]
    gaps = [g for t in done for g in t.gaps_s]
    e2e = [t.e2e_s for t in done if t.e2e_s is not None]
    tokens = sum(t.tokens for t in done)
    # each stream's rate after its first token, summed: the decode throughput, without the prefill's share
    decode = sum((t.tokens - 1) / (t.e2e_s - t.ttft_s) for t in done
                 if t.ttft_s is not None and t.e2e_s is not None and t.e2e_s > t.ttft_s and t.tokens > 1)
    errors = sorted({t.error for t in traces if t.error})[:3]
    return {"run": name, "requests": len(traces), "completed": len(done),
            "refused": sum(t.status == "refused" for t in traces), "failed": sum(t.status == "failed" for t in traces),
            "first_burst": first_burst, "wall_s": wall_s, "output_tokens": tokens,
            "output_tokens_per_s": tokens / wall_s if wall_s > 0 else None,
            "decode_tokens_per_s": decode or None,
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            "itl_p50_s": _pct(gaps, 50), "itl_p99_s": _pct(gaps, 99),
            "e2e_p50_s": _pct(e2e, 50), "e2e_p99_s": _pct(e2e, 99), "errors": errors}


async def _burst(client: openai.AsyncOpenAI, prompts: list[list[int]], gen: int) -> tuple[list[Trace], float]:
    traces = [Trace() for _ in prompts]
    t0 = time.perf_counter()
    await asyncio.gather(*(_one(client, p, gen, t) for p, t in zip(prompts, traces, strict=True)))
    return traces, time.perf_counter() - t0


async def _poisson(client: openai.AsyncOpenAI, prompts: list[list[int]], gen: int, rate: float,
                   rng: random.Random) -> tuple[list[Trace], float]:
    traces = [Trace() for _ in prompts]
    tasks = []
    t0 = time.perf_counter()
    for prompt, trace in zip(prompts, traces, strict=True):
        tasks.append(asyncio.ensure_future(_one(client, prompt, gen, trace)))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    return traces, time.perf_counter() - t0


async def _poll_status(url: str, every_s: float, done: asyncio.Event, latencies_s: list[float]) -> None:
    """``GET /v1/stagewise/status`` every ``every_s`` until ``done``, as an open web page does."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while not done.is_set():
            t0 = time.perf_counter()
            r = await http.get("/v1/stagewise/status")
            latencies_s.append(time.perf_counter() - t0)
            r.raise_for_status()
            try:
                await asyncio.wait_for(done.wait(), every_s)
            except TimeoutError:
                pass


async def _burst_polled(client: openai.AsyncOpenAI, url: str, prompts: list[list[int]], gen: int,
                        every_s: float) -> tuple[list[Trace], float, list[float]]:
    done = asyncio.Event()
    latencies: list[float] = []
    poller = asyncio.ensure_future(_poll_status(url, every_s, done, latencies))
    traces, wall = await _burst(client, prompts, gen)
    done.set()
    await poller
    return traces, wall, latencies


async def _status_seconds(url: str) -> float:
    """The server's ``stagewise_status_seconds_total``: time spent building status bodies so far."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        text = (await http.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("stagewise_status_seconds_total "):
            return float(line.split()[1])
    raise SystemExit("the server exports no stagewise_status_seconds_total")


def _mean_rate(runs: list[dict[str, Any]], key: str = "output_tokens_per_s") -> float:
    return sum(r[key] or 0 for r in runs) / len(runs)


async def _polled_run(client: openai.AsyncOpenAI, url: str, prompts: list[list[int]],
                     args: argparse.Namespace) -> dict[str, Any]:
    """One burst while the status endpoint is polled: its figures, the polls' latency at the client and
    the server's own time building the bodies (``stagewise_status_seconds_total``'s growth)."""
    spent_s = await _status_seconds(url)
    traces, wall, polls = await _burst_polled(client, url, prompts, args.gen, args.status_poll_s)
    spent_s = await _status_seconds(url) - spent_s
    return {"concurrency": len(prompts), **_summary(f"burst {len(prompts)} + status", traces, wall, False),
            "status_poll_s": args.status_poll_s, "status_polls": len(polls),
            "status_p50_s": _pct(polls, 50), "status_p99_s": _pct(polls, 99), "status_max_s": max(polls, default=None),
            "status_build_ms_per_s": 1e3 * spent_s / wall, "status_build_ms_per_poll": 1e3 * spent_s / max(1, len(polls))}


async def _status_rounds(client: openai.AsyncOpenAI, url: str, prompts: list[list[int]], args: argparse.Namespace,
                         first: dict[str, Any]) -> list[dict[str, Any]]:
    """``--status-rounds`` rounds after the unpolled run ``first``: two polled runs, then an unpolled one,
    so each round's polled pair sits between two unpolled runs (A B B A) and drift cancels. The last
    polled run carries the polled / unpolled ratios (overall and each round's); the server's first
    burst (warm-up) counts as unpolled only when nothing else is."""
    runs: list[dict[str, Any]] = []
    on: list[dict[str, Any]] = []
    off = [first]
    ratios, decode_ratios = [], []
    for _round in range(args.status_rounds):
        polled = [await _polled_run(client, url, prompts, args) for _ in range(2)]
        traces, wall = await _burst(client, prompts, args.gen)
        off.append({"concurrency": len(prompts), **_summary(f"burst {len(prompts)}", traces, wall, False)})
        runs += [*polled, off[-1]]
        on += polled
        pair = [r for r in off[-2:] if not r["first_burst"]] or off[-2:]
        ratios.append(_mean_rate(polled) / _mean_rate(pair))
        decode_ratios.append(_mean_rate(polled, "decode_tokens_per_s") / _mean_rate(pair, "decode_tokens_per_s"))
    off = [r for r in off if not r["first_burst"]] or off
    rate_off = _mean_rate(off)
    last = runs[-2]
    last["status_on_over_off"] = _mean_rate(on) / rate_off if rate_off else None
    last["status_on_over_off_rounds"] = ratios
    last["status_decode_on_over_off"] = _mean_rate(on, "decode_tokens_per_s") / _mean_rate(off, "decode_tokens_per_s")
    last["status_decode_on_over_off_rounds"] = decode_ratios
    print(f"burst {len(prompts)} + status every {args.status_poll_s:g} s: on/off {last['status_on_over_off']:.4f} "
          f"(decode {last['status_decode_on_over_off']:.4f}), building bodies "
          f"{sum(r['status_build_ms_per_s'] for r in on) / len(on):.3f} ms/s, status p99 {last['status_p99_s']}",
          flush=True)
    return runs


async def _drive(args: argparse.Namespace, url: str, served: str, prompts: list[list[int]],
                 rng: random.Random) -> list[dict[str, Any]]:
    """Every burst level, then the Poisson run, on one event loop and one client."""
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=4096)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=3600,
                                http_client=openai.DefaultAsyncHttpxClient(limits=limits))
    client.served_model = served  # type: ignore[attr-defined]
    runs: list[dict[str, Any]] = []
    async with client:
        for i, level in enumerate(args.concurrency):
            traces, wall = await _burst(client, prompts[:level], args.gen)
            runs.append({"concurrency": level, **_summary(f"burst {level}", traces, wall, i == 0)})
            print(f"burst {level}: {runs[-1]['completed']} completed, {runs[-1]['refused']} refused, "
                  f"{runs[-1]['failed']} failed", flush=True)
            if args.status_poll_s:
                runs += await _status_rounds(client, url, prompts[:level], args, runs[-1])
        if args.rate:
            traces, wall = await _poisson(client, prompts[: args.requests], args.gen, args.rate, rng)
            runs.append({"concurrency": None, "rate_per_s": args.rate,
                         **_summary(f"poisson {args.rate}/s", traces, wall, not runs)})
    return runs


def _prompts(url: str, count: int, length: int, rng: random.Random) -> list[list[int]]:
    """``count`` prompts of exactly ``length`` token ids: the server's own tokenization of varied words."""
    words = ["river", "stone", "light", "market", "engine", "garden", "signal", "paper", "window", "orbit"]
    out = []
    for _ in range(count):
        text = " ".join(rng.choice(words) for _ in range(2 * length + 8))
        ids = httpx.post(f"{url}/tokenize", json={"prompt": text}, timeout=60).json()["tokens"]
        if len(ids) < length:
            raise SystemExit(f"the tokenizer gave {len(ids)} tokens for a {length}-token prompt")
        out.append(ids[:length])
    return out


def _python_path() -> str:
    """This checkout first, then whatever PYTHONPATH already names (packages installed beside it)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def _serve(args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen[bytes]:
    model = [] if args.model == "demo" else [args.model]
    cmd = [sys.executable, "-m", "stagewise", "serve", *model, "--port", str(port),
           "--queue", str(args.queue or max(args.concurrency)), *_device_args(args)]
    if args.max_seqs:
        cmd += ["--max-seqs", str(args.max_seqs)]
    env = {**os.environ, "PYTHONPATH": _python_path(), "COLUMNS": "300"}  # banner lines unwrapped in the log
    env.pop("STAGEWISE_API_KEY", None)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _device_args(args: argparse.Namespace) -> list[str]:
    out = []
    for flag, value in (("--devices", args.devices), ("--placement", args.placement), ("--context", args.context)):
        if value is not None:
            out += [flag, str(value)]
    return out


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if process.poll() is not None:
            raise SystemExit(f"stagewise serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"stagewise serve not ready after {timeout_s} s:\n{log.read_text()[-3000:]}")


def _in_process(args: argparse.Namespace) -> dict[str, Any]:
    """``stagewise bench MODEL --concurrency LEVELS --json`` in a subprocess (the server has exited)."""
    model = args.model
    extra: list[str] = []
    if model == "demo":
        from stagewise.engine.demo_model import DEMO_CONTEXT, DEMO_DEVICES, DEMO_PLACEMENT, ensure_demo_model

        model = str(ensure_demo_model())
        extra = ["--devices", args.devices or DEMO_DEVICES, "--placement", args.placement or DEMO_PLACEMENT,
                 "--context", str(args.context or DEMO_CONTEXT)]
    else:
        extra = _device_args(args)
    cmd = [sys.executable, "-m", "stagewise", "bench", model, *extra, "--concurrency",
           ",".join(map(str, args.concurrency)), "--prompt", str(args.prompt), "--gen", str(args.gen), "--json"]
    env = {**os.environ, "PYTHONPATH": _python_path()}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.bench_timeout_s)
    if done.returncode != 0:
        return {"command": " ".join(cmd), "error": (done.stderr or done.stdout)[-2000:]}
    text = done.stdout
    result = json.loads(text[text.index("{"):])
    return {"command": " ".join(cmd), "result": result}


def _level_figures(in_process: dict[str, Any]) -> dict[int, dict[str, Any]]:
    levels = in_process.get("result", {}).get("levels") or []
    return {int(row.get("concurrency", row.get("streams", 0))): row for row in levels if isinstance(row, dict)}


def _row(values: list[Any]) -> str:
    return " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="what stagewise serve takes, or 'demo' (or give --model)")
    p.add_argument("--model", dest="model_flag", help="the same as the positional MODEL")
    p.add_argument("--devices")
    p.add_argument("--placement")
    p.add_argument("--context", type=int)
    p.add_argument("--max-seqs", type=int)
    p.add_argument("--queue", type=int, help="serve's --queue (default: the largest level)")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64, 128])
    p.add_argument("--rate", type=float, help="also a Poisson run at this many requests per second")
    p.add_argument("--requests", type=int, default=64, help="requests of the Poisson run")
    p.add_argument("--prompt", type=int, default=208, help="prompt tokens per request")
    p.add_argument("--gen", type=int, default=128, help="tokens out per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout-s", type=float, default=1800)
    p.add_argument("--bench-timeout-s", type=float, default=3600)
    p.add_argument("--no-in-process", dest="in_process", action="store_false")
    p.add_argument("--status-poll-s", type=float, default=None,
                   help="also run each level while polling /v1/stagewise/status this often (the web page: 1)")
    p.add_argument("--status-rounds", type=int, default=1,
                   help="A B B A rounds (unpolled, polled, polled, unpolled) a level with --status-poll-s")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    args.model = args.model_flag or args.model
    if not args.model:
        p.error("give MODEL (or --model MODEL; 'demo' for the built-in demo model)")
    rng = random.Random(args.seed)

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkstemp(prefix="serve_load_", suffix=".log")[1])
    started = time.perf_counter()
    server = _serve(args, port, log)
    runs: list[dict[str, Any]] = []
    try:
        ready_s = _wait_ready(server, url, log, args.startup_timeout_s)
        served = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        largest = max([*args.concurrency, args.requests if args.rate else 0])
        prompts = _prompts(url, largest, args.prompt, rng)
        runs = asyncio.run(_drive(args, url, served, prompts, rng))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
    server_log = log.read_text(errors="replace").splitlines()
    banner = [line for line in server_log if "warmed up" in line or "sequences at once" in line]
    in_process = _in_process(args) if args.in_process else {}
    figures = _level_figures(in_process)
    for run in runs:
        row = figures.get(run["concurrency"]) if run["concurrency"] and "status_poll_s" not in run else None
        if row is not None:
            run["in_process_aggregate_tokens_per_s"] = row.get("aggregate_tokens_per_s")
            run["in_process_decode_tokens_per_s"] = row.get("decode_tokens_per_s")
            agg = row.get("aggregate_tokens_per_s")
            run["http_over_in_process_aggregate"] = (run["output_tokens_per_s"] / agg
                                                     if agg and run["output_tokens_per_s"] else None)
    try:
        import torch

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:
        device = "unknown"
    result = {"command": " ".join(["python3", *sys.argv]), "machine": platform.node(), "device": device,
              "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model,
              "serve_args": _device_args(args) + (["--max-seqs", str(args.max_seqs)] if args.max_seqs else []),
              "prompt_tokens": args.prompt, "gen_tokens": args.gen, "server_ready_s": ready_s,
              "server_banner": banner, "runs": runs, "in_process": in_process,
              "total_s": time.perf_counter() - started}
    head = ["run", "done", "refused", "failed", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
            "e2e p50", "e2e p99", "in-proc agg", "HTTP/in-proc"]
    print(" | ".join(head))
    for run in runs:
        print(_row([run["run"], run["completed"], run["refused"], run["failed"], run["output_tokens_per_s"],
                    run["ttft_p50_s"], run["ttft_p99_s"], run["itl_p50_s"], run["itl_p99_s"], run["e2e_p50_s"],
                    run["e2e_p99_s"], run.get("in_process_aggregate_tokens_per_s"),
                    run.get("http_over_in_process_aggregate")]))
    if in_process.get("error"):
        print(f"in-process bench failed: {in_process['error'][-500:]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
