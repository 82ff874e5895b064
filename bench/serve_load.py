"""Load benchmark over HTTP: a real ``stagewise serve`` process driven by the ``openai`` client's streaming.

    python bench/serve_load.py [--model] MODEL [--devices D] [--placement P] [--max-seqs N] [--queue N]
        [--concurrency 1,8,32,64,128] [--rate R --requests M] [--prompt 208] [--gen 128] [--passes P]
        [--fresh-prompts] [--endpoint completions|chat] [--peer "llama-server ARGS" [--peer-name NAME]]
        [--json bench/results/OUT.json]

``MODEL`` is what ``stagewise serve`` takes (a directory, a GGUF file, ``random:PRESET``), or ``demo``
for the built-in demo model. For each concurrency level N, N streamed requests (``--gen`` tokens out,
greedy, ``ignore_eos``) are sent at once: ``/v1/completions`` with prompts of exactly ``--prompt`` token
ids, or with ``--endpoint chat`` ``/v1/chat/completions`` with one user message, the text of those ids
(the chat template adds its own few tokens; ``prompt tok`` reports what the server counted). Tokens are
counted from the final usage chunk; TTFT and the gaps from the chunks that carry text. ``--passes P``
runs every level P times in turn (the first pass is the first burst after ready); ``--fresh-prompts``
gives every burst prompts not sent before (else each level reuses the first N, and a prefix cache serves
them again). With
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

``--peer "CMD ARGS"`` measures another OpenAI-compatible server beside ours with the same client, prompts
and levels (``--endpoint`` defaults to ``chat`` then, and the in-process bench is skipped): ours runs
first and stops, then ``CMD ARGS -m MODEL --port PORT`` starts (or the command with ``{model}`` and
``{port}`` placed where it says), is driven once ``/health`` answers 200, and stops. One table shows
both and their ratios (ours / the peer's: output tok/s, TTFT p50/p99, ITL p50/p99, on the last pass),
e.g. ``--peer "/tmp/lb/bin/llama-server -ngl 99 -fa on -np 64 -c 262144"`` on a GGUF file. With
``--status-poll-s`` (our status endpoint) no peer is run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
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
    prompt_tokens: int | None = None  # as the server counted them (its usage chunk)
    error: str | None = None


@dataclass(frozen=True)
class Prompt:
    """One request's prompt: token ids (``/v1/completions``) and their text (a chat message)."""

    ids: list[int]
    text: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def _chunk_text(chunk: Any) -> str:
    """The text a streamed chunk carries: a completion's text, or a chat delta's content or reasoning."""
    if not chunk.choices:
        return ""
    choice = chunk.choices[0]
    if hasattr(choice, "text"):
        return str(choice.text or "")
    delta = choice.delta
    return str(delta.content or "") + str(getattr(delta, "reasoning_content", None) or "")


async def _one(client: openai.AsyncOpenAI, prompt: Prompt, gen: int, trace: Trace, endpoint: str = "completions") -> None:
    """One streamed request: TTFT and gaps from the chunks that carry text, the token count from the
    final usage chunk (a random tokenizer's tokens often decode to no text, so chunks undercount them)."""
    t0 = time.perf_counter()
    last = None
    chunks = 0
    common: dict[str, Any] = dict(model=client.served_model, max_tokens=gen, temperature=0, stream=True,  # type: ignore[attr-defined]
                                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    try:
        if endpoint == "chat":
            stream: Any = await client.chat.completions.create(
                messages=[{"role": "user", "content": prompt.text}], **common)
        else:
            stream = await client.completions.create(prompt=prompt.ids, **common)
        async for chunk in stream:
            if chunk.usage is not None:
                trace.tokens = chunk.usage.completion_tokens
                trace.prompt_tokens = chunk.usage.prompt_tokens
            if not _chunk_text(chunk):
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
    prompt_tokens = [t.prompt_tokens for t in done if t.prompt_tokens is not None]
    return {"run": name, "requests": len(traces), "completed": len(done),
            "refused": sum(t.status == "refused" for t in traces), "failed": sum(t.status == "failed" for t in traces),
            "first_burst": first_burst, "wall_s": wall_s, "output_tokens": tokens,
            "output_tokens_per_s": tokens / wall_s if wall_s > 0 else None,
            "decode_tokens_per_s": decode or None,
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            "itl_p50_s": _pct(gaps, 50), "itl_p99_s": _pct(gaps, 99),
            "e2e_p50_s": _pct(e2e, 50), "e2e_p99_s": _pct(e2e, 99),
            "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens) if prompt_tokens else None, "errors": errors}


async def _burst(client: openai.AsyncOpenAI, prompts: list[Prompt], gen: int) -> tuple[list[Trace], float]:
    traces = [Trace() for _ in prompts]
    t0 = time.perf_counter()
    endpoint = client.endpoint  # type: ignore[attr-defined]
    await asyncio.gather(*(_one(client, p, gen, t, endpoint) for p, t in zip(prompts, traces, strict=True)))
    return traces, time.perf_counter() - t0


async def _poisson(client: openai.AsyncOpenAI, prompts: list[Prompt], gen: int, rate: float,
                   rng: random.Random) -> tuple[list[Trace], float]:
    traces = [Trace() for _ in prompts]
    tasks = []
    t0 = time.perf_counter()
    for prompt, trace in zip(prompts, traces, strict=True):
        tasks.append(asyncio.ensure_future(_one(client, prompt, gen, trace, client.endpoint)))  # type: ignore[attr-defined]
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


async def _burst_polled(client: openai.AsyncOpenAI, url: str, prompts: list[Prompt], gen: int,
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


async def _polled_run(client: openai.AsyncOpenAI, url: str, prompts: list[Prompt],
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


async def _status_rounds(client: openai.AsyncOpenAI, url: str, prompts: list[Prompt], args: argparse.Namespace,
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


async def _drive(args: argparse.Namespace, url: str, served: str, prompts: list[Prompt],
                 rng: random.Random) -> list[dict[str, Any]]:
    """Every burst level (``--passes`` times), then the Poisson run, on one event loop and one client."""
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=4096)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=3600,
                                http_client=openai.DefaultAsyncHttpxClient(limits=limits))
    client.served_model = served  # type: ignore[attr-defined]
    client.endpoint = args.endpoint  # type: ignore[attr-defined]
    runs: list[dict[str, Any]] = []
    used = 0  # with --fresh-prompts, each burst takes the next prompts
    async with client:
        for round_ in range(args.passes):
            for level in args.concurrency:
                start = used if args.fresh_prompts else 0
                used = start + level
                traces, wall = await _burst(client, prompts[start:used], args.gen)
                name = f"burst {level}" + (f" pass {round_ + 1}" if args.passes > 1 else "")
                runs.append({"concurrency": level, "pass": round_ + 1, **_summary(name, traces, wall, not runs)})
                print(f"{name}: {runs[-1]['completed']} completed, {runs[-1]['refused']} refused, "
                      f"{runs[-1]['failed']} failed", flush=True)
                if args.status_poll_s:
                    runs += await _status_rounds(client, url, prompts[:level], args, runs[-1])
        if args.rate:
            start = used if args.fresh_prompts else 0
            traces, wall = await _poisson(client, prompts[start:start + args.requests], args.gen, args.rate, rng)
            runs.append({"concurrency": None, "rate_per_s": args.rate,
                         **_summary(f"poisson {args.rate}/s", traces, wall, not runs)})
    return runs


def _prompts(url: str, count: int, length: int, rng: random.Random) -> list[Prompt]:
    """``count`` prompts of exactly ``length`` token ids: the server's own tokenization of varied words,
    with the text of those ids (what a chat message sends)."""
    words = ["river", "stone", "light", "market", "engine", "garden", "signal", "paper", "window", "orbit"]
    out = []
    for _ in range(count):
        text = " ".join(rng.choice(words) for _ in range(2 * length + 8))
        ids = httpx.post(f"{url}/tokenize", json={"prompt": text}, timeout=60).json()["tokens"]
        if len(ids) < length:
            raise SystemExit(f"the tokenizer gave {len(ids)} tokens for a {length}-token prompt")
        ids = ids[:length]
        out.append(Prompt(ids, httpx.post(f"{url}/detokenize", json={"tokens": ids}, timeout=60).json()["content"]))
    return out


def _prompts_needed(args: argparse.Namespace) -> int:
    """Prompts a run sends: the largest level's (and the Poisson run's), or with ``--fresh-prompts`` one per
    request of every burst, so no prompt is sent twice (no prefix-cache hit beyond the chat template's)."""
    poisson = args.requests if args.rate else 0
    if args.fresh_prompts:
        return sum(args.concurrency) * args.passes + poisson
    return max([*args.concurrency, poisson])


def _python_path() -> str:
    """This checkout first, then whatever PYTHONPATH already names (packages installed beside it)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def _serve(args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen[bytes]:
    model = [] if args.model == "demo" else [args.model]
    cmd = [sys.executable, "-m", "stagewise", "serve", *model, "--port", str(port),
           "--queue", str(args.queue or max(args.concurrency)), *_device_args(args)]
    if args.max_seqs:
        cmd += ["--max-seqs", str(args.max_seqs)]
    cmd += args.serve_args
    env = {**os.environ, "PYTHONPATH": _python_path(), "COLUMNS": "300"}  # banner lines unwrapped in the log
    env.pop("STAGEWISE_API_KEY", None)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _device_args(args: argparse.Namespace) -> list[str]:
    out = []
    for flag, value in (("--devices", args.devices), ("--placement", args.placement), ("--context", args.context)):
        if value is not None:
            out += [flag, str(value)]
    return out


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float,
                label: str = "stagewise serve") -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if process.poll() is not None:
            raise SystemExit(f"{label} exited with {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{label} not ready after {timeout_s} s:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def peer_command(template: str, model: str, port: int) -> list[str]:
    """The peer's argv: ``template`` split as a shell would, with ``{model}`` and ``{port}`` filled in, or
    ``-m MODEL --port PORT`` appended when it names neither (llama-server's flags)."""
    argv = shlex.split(template)
    if not argv:
        raise SystemExit("--peer: give the peer's command (e.g. \"llama-server -ngl 99 -np 64 -c 262144\")")
    if not any("{model}" in a or "{port}" in a for a in argv):
        return [*argv, "-m", model, "--port", str(port)]
    return [a.replace("{model}", model).replace("{port}", str(port)) for a in argv]


def _measure(args: argparse.Namespace, start: Any, label: str, prompts: list[Prompt] | None,
             rng: random.Random) -> tuple[dict[str, Any], list[Prompt]]:
    """Start a server (``start(port, log)``), wait for ``/health``, drive every level, stop it. The prompts
    are made on the first server (``/tokenize``, ``/detokenize``) and reused on the next."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkstemp(prefix="serve_load_", suffix=".log")[1])
    process = start(port, log)
    try:
        ready_s = _wait_ready(process, url, log, args.startup_timeout_s, label)
        served = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        if prompts is None:
            prompts = _prompts(url, _prompts_needed(args), args.prompt, rng)
        runs = asyncio.run(_drive(args, url, served, prompts, rng))
    finally:
        _stop(process)
    return {"command": " ".join(process.args) if isinstance(process.args, list) else str(process.args),  # type: ignore[arg-type]
            "server_ready_s": ready_s, "served_model": served, "runs": runs,
            "log": log.read_text(errors="replace").splitlines()}, prompts


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


RATIO_KEYS = ("output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s")


def compare(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level of the last pass: ours / the peer's for each of :data:`RATIO_KEYS` (tok/s: above 1 is
    ours faster; latencies: below 1 is ours quicker); ``None`` where either side has no figure."""
    def last_pass(runs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        bursts = [r for r in runs if r.get("concurrency") and "status_poll_s" not in r]
        final = max((r["pass"] for r in bursts), default=1)
        return {r["concurrency"]: r for r in bursts if r["pass"] == final}

    mine, peer = last_pass(ours), last_pass(theirs)
    rows = []
    for level in sorted(mine.keys() & peer.keys()):
        a, b = mine[level], peer[level]
        rows.append({"concurrency": level, **{f"{k}_ratio": (a[k] / b[k] if a[k] and b[k] else None) for k in RATIO_KEYS}})
    return rows


def _print_runs(runs: list[dict[str, Any]]) -> None:
    head = ["run", "done", "refused", "failed", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
            "e2e p50", "e2e p99", "in-proc agg", "HTTP/in-proc"]
    print(" | ".join(head))
    for run in runs:
        print(_row([run["run"], run["completed"], run["refused"], run["failed"], run["output_tokens_per_s"],
                    run["ttft_p50_s"], run["ttft_p99_s"], run["itl_p50_s"], run["itl_p99_s"], run["e2e_p50_s"],
                    run["e2e_p99_s"], run.get("in_process_aggregate_tokens_per_s"),
                    run.get("http_over_in_process_aggregate")]))


def _print_comparison(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], peer_name: str,
                      ratios: list[dict[str, Any]]) -> None:
    """Both servers' runs level by level, then ``stagewise / PEER`` on the last pass."""
    print(" | ".join(["run", "server", "done", "failed", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
                      "e2e p50", "prompt tok"]))
    for a, b in zip(ours, theirs, strict=False):
        for name, run in (("stagewise", a), (peer_name, b)):
            print(_row([run["run"], name, run["completed"], run["failed"], run["output_tokens_per_s"],
                        run["ttft_p50_s"], run["ttft_p99_s"], run["itl_p50_s"], run["itl_p99_s"], run["e2e_p50_s"],
                        run["prompt_tokens_mean"]]))
    print(f"stagewise / {peer_name} (last pass; tok/s above 1 and latencies below 1 favour stagewise)")
    print(" | ".join(["streams", "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "e2e p50"]))
    for row in ratios:
        print(_row([row["concurrency"], *(row[f"{k}_ratio"] for k in RATIO_KEYS)]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="what stagewise serve takes, or 'demo' (or give --model)")
    p.add_argument("--model", dest="model_flag", help="the same as the positional MODEL")
    p.add_argument("--devices")
    p.add_argument("--placement")
    p.add_argument("--context", type=int)
    p.add_argument("--max-seqs", type=int)
    p.add_argument("--serve-arg", dest="serve_args", action="append", default=[],
                   help="one more argument for stagewise serve (repeat: --serve-arg=--no-prefix-cache)")
    p.add_argument("--queue", type=int, help="serve's --queue (default: the largest level)")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64, 128])
    p.add_argument("--rate", type=float, help="also a Poisson run at this many requests per second")
    p.add_argument("--requests", type=int, default=64, help="requests of the Poisson run")
    p.add_argument("--prompt", type=int, default=208, help="prompt tokens per request")
    p.add_argument("--gen", type=int, default=128, help="tokens out per request")
    p.add_argument("--passes", type=int, default=1, help="run every level this many times in turn")
    p.add_argument("--fresh-prompts", action="store_true",
                   help="every burst sends prompts never sent before (default: each level reuses the first N, "
                        "which a prefix cache then serves)")
    p.add_argument("--endpoint", choices=["completions", "chat"], default=None,
                   help="/v1/completions with token ids, or /v1/chat/completions with their text "
                        "(default: completions; chat with --peer)")
    p.add_argument("--peer", default=None, help='another server measured beside ours: "llama-server ARGS" '
                   "(-m MODEL --port PORT appended), or a command with {model} and {port} in it")
    p.add_argument("--peer-name", default=None, help="the peer's name in the table (default: its program's name)")
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
    if args.peer is not None and args.status_poll_s:
        p.error("--status-poll-s polls our status endpoint: run it without --peer")
    if args.passes < 1:
        p.error("--passes must be at least 1")
    args.endpoint = args.endpoint or ("chat" if args.peer else "completions")
    rng = random.Random(args.seed)

    started = time.perf_counter()
    ours, prompts = _measure(args, lambda port, log: _serve(args, port, log), "stagewise serve", None, rng)
    runs = ours["runs"]
    banner = [line for line in ours["log"] if "warmed up" in line or "sequences at once" in line]
    peer: dict[str, Any] = {}
    ratios: list[dict[str, Any]] = []
    if args.peer is not None:
        peer_name = args.peer_name or Path(shlex.split(args.peer)[0]).name

        def start_peer(port: int, log: Path) -> subprocess.Popen[bytes]:
            env = {**os.environ, "PYTHONPATH": _python_path()}
            env.pop("STAGEWISE_API_KEY", None)
            return subprocess.Popen(peer_command(args.peer, args.model, port), cwd=REPO, env=env,
                                    stdout=log.open("wb"), stderr=subprocess.STDOUT)

        peer, _ = _measure(args, start_peer, peer_name, prompts, rng)
        peer["name"] = peer_name
        peer["log"] = peer["log"][-40:]
        ratios = compare(runs, peer["runs"])
    in_process = _in_process(args) if args.in_process and args.peer is None else {}
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
    result = {"command": shlex.join(["python3", *sys.argv]), "machine": platform.node(), "device": device,
              "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model,
              "serve_args": _device_args(args) + (["--max-seqs", str(args.max_seqs)] if args.max_seqs else []) + args.serve_args,
              "endpoint": args.endpoint, "prompt_tokens": args.prompt, "gen_tokens": args.gen,
              "server_ready_s": ours["server_ready_s"], "server_banner": banner, "runs": runs,
              "in_process": in_process, "total_s": time.perf_counter() - started}
    if peer:
        result |= {"peer": peer, "comparison": ratios}
        _print_comparison(runs, peer["runs"], peer["name"], ratios)
    else:
        _print_runs(runs)
    if in_process.get("error"):
        print(f"in-process bench failed: {in_process['error'][-500:]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
