"""Prefix-cache benchmark over HTTP: a real ``stagewise serve`` process, cache on then off, in one run.

    python3 bench/prefix_cache_load.py MODEL [--devices D] [--placement P] [--context N] [--max-seqs N]
        [--chat-system 1500] [--turns 10] [--agent-system 4000] [--agents 32] [--agent-turns 1] [--question 200]
        [--gen 32] [--peer "llama-server ARGS" [--peer-name NAME]] [--json bench/results/OUT.json]

e.g. ``python3 bench/prefix_cache_load.py random:llama-3.1-8b --devices cuda:0 --placement single``.
``MODEL`` is what ``stagewise serve`` takes, or ``demo``. Two workloads, each against a server with the
prefix cache on and against one started with ``--no-prefix-cache``:

- chat: one client, ``--turns`` turns after a ``--chat-system``-token system prompt; each turn's prompt
  is the previous turn's prompt, then ``--gen`` token ids standing for the reply (the reply's own ids
  are not fed back: the cache keys prompt blocks only, so what matters is that the prefix repeats),
  then a 60-token user message;
- agent: ``--agents`` clients at once sharing a ``--agent-system``-token system prompt and tool list,
  each with its own ``--question``-token question, for ``--agent-turns`` turns each (a later turn's
  prompt grows as the chat's do; every turn's TTFT counts).

With ``--peer`` (e.g. ``"llama-server -ngl 99 -fa on -np 16 -c 131072"``; ``{model}``/``{port}`` filled in,
else ``-m MODEL --port PORT`` appended) the same workloads, same token ids, run against that server too
(its own prompt cache as it comes), and the cache-on figures are compared with it.

Prompts are token ids sent to ``/v1/completions`` (exact lengths; greedy, ``--gen`` tokens out,
streamed). Reported per workload and setting: wall time, TTFT p50/p99, and the server's
``stagewise_prefix_cache_hit_tokens_total`` / ``_queries_total`` deltas; then cache-on over cache-off
ratios. JSON (command, machine, date, figures) to ``--json``; a table is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.serve_load import _free_port, _pct, _python_path, _stop, _wait_ready, peer_command

REPO = Path(__file__).resolve().parent.parent


def _ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]  # clear of the usual special ids


async def _one(client: openai.AsyncOpenAI, prompt: list[int], gen: int) -> float:
    """Send one streamed completion; seconds to its first token."""
    t0 = time.perf_counter()
    ttft = None
    stream = await client.completions.create(model=client.served,  # type: ignore[attr-defined]
                                              prompt=prompt, max_tokens=gen, temperature=0, stream=True)
    async for _ in stream:
        if ttft is None:
            ttft = time.perf_counter() - t0
    return ttft if ttft is not None else time.perf_counter() - t0


def _counters(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        for name in ("stagewise_prefix_cache_hit_tokens_total", "stagewise_prefix_cache_queries_total",
                     "stagewise_prefill_tokens_total"):
            if line.startswith(name + " "):
                out[name] = float(line.split()[-1])
    return out


async def _chat(client: openai.AsyncOpenAI, args: argparse.Namespace, vocab: int) -> list[float]:
    rng = random.Random(1)
    prompt = _ids(rng, vocab, args.chat_system)
    ttfts = []
    for turn in range(args.turns):
        prompt = prompt + _ids(rng, vocab, 60) if turn == 0 else prompt + _ids(rng, vocab, args.gen + 60)
        ttfts.append(await _one(client, prompt, args.gen))
    return ttfts


async def _agents(client: openai.AsyncOpenAI, args: argparse.Namespace, vocab: int) -> list[float]:
    rng = random.Random(2)
    shared = _ids(rng, vocab, args.agent_system)
    prompts = [shared + _ids(rng, vocab, args.question) for _ in range(args.agents)]
    later = [[_ids(rng, vocab, args.gen + 60) for _ in range(args.agent_turns - 1)] for _ in prompts]

    async def agent(prompt: list[int], turns: list[list[int]]) -> list[float]:
        ttfts = [await _one(client, prompt, args.gen)]
        for more in turns:  # the reply's stand-in and the next message, as the chat's turns
            prompt = prompt + more
            ttfts.append(await _one(client, prompt, args.gen))
        return ttfts

    runs = await asyncio.gather(*(agent(p, t) for p, t in zip(prompts, later, strict=True)))
    return [t for run in runs for t in run]


def _workload(url: str, name: str, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    before = _counters(url)
    async def drive() -> tuple[list[float], float]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=3600, max_retries=0)
        client.served = args.served  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        ttfts = await (_chat(client, args, vocab) if name == "chat" else _agents(client, args, vocab))
        wall_s = time.perf_counter() - t0
        await client.close()
        return ttfts, wall_s

    ttfts, wall_s = asyncio.run(drive())
    after = _counters(url)
    delta = {k.removeprefix("stagewise_").removesuffix("_total"): after.get(k, 0) - before.get(k, 0) for k in after}
    return {"workload": name, "requests": len(ttfts), "wall_s": wall_s, "ttft_p50_s": _pct(ttfts, 50),
            "ttft_p99_s": _pct(ttfts, 99), **delta}


def _run_server(args: argparse.Namespace, cache: bool, peer: bool = False) -> list[dict[str, Any]]:
    """Both workloads against a fresh server: ours with the prefix cache on or off, or the ``--peer``."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    if peer:
        cmd = peer_command(args.peer, args.model, port)
    else:
        model = [] if args.model == "demo" else [args.model]
        cmd = [sys.executable, "-m", "stagewise", "serve", *model, "--port", str(port), "--queue", str(args.agents + 4)]
        for flag, value in (("--devices", args.devices), ("--placement", args.placement), ("--context", args.context),
                            ("--max-seqs", args.max_seqs)):
            if value is not None:
                cmd += [flag, str(value)]
        if not cache:
            cmd.append("--no-prefix-cache")
    log = Path(tempfile.mkdtemp()) / "serve.log"
    env = {**os.environ, "PYTHONPATH": _python_path(), "COLUMNS": "300"}
    env.pop("STAGEWISE_API_KEY", None)
    process = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        _wait_ready(process, url, log, 1800, args.peer_name if peer else "stagewise serve")
        args.served = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        rows = [_workload(url, name, args, args.vocab) for name in ("chat", "agent")]
        for row in rows:
            row["server"] = args.peer_name if peer else "stagewise"
            row["prefix_cache"] = cache
        return rows
    finally:
        _stop(process)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="what stagewise serve takes, or 'demo'")
    p.add_argument("--devices")
    p.add_argument("--placement")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--max-seqs", type=int)
    p.add_argument("--vocab", type=int, default=256, help="token ids drawn below this (the demo model's vocabulary)")
    p.add_argument("--chat-system", type=int, default=1500)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--agent-system", type=int, default=4000)
    p.add_argument("--agents", type=int, default=32)
    p.add_argument("--agent-turns", type=int, default=1, help="turns each agent takes (default 1)")
    p.add_argument("--question", type=int, default=200)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--peer", help="the same workloads against this server too (e.g. \"llama-server -ngl 99 -np 16\")")
    p.add_argument("--peer-name", default="llama-server")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.peer and args.model == "demo":
        raise SystemExit("--peer needs a model file both servers load")
    rows = _run_server(args, True) + _run_server(args, False) + (_run_server(args, True, peer=True) if args.peer else [])
    header = ["server", "workload", "cache", "requests", "wall s", "TTFT p50 s", "TTFT p99 s", "hit tok", "queried tok",
              "prefilled tok"]
    print(" | ".join(header))
    for r in rows:
        print(" | ".join(str(x) for x in (r["server"], r["workload"], "on" if r["prefix_cache"] else "off", r["requests"],
                                          f"{r['wall_s']:.2f}", f"{r['ttft_p50_s']:.3f}", f"{r['ttft_p99_s']:.3f}",
                                          int(r.get("prefix_cache_hit_tokens", 0)),
                                          int(r.get("prefix_cache_queries", 0)), int(r.get("prefill_tokens", 0)))))
    ratios = {}
    for name in ("chat", "agent"):
        ours = [r for r in rows if r["workload"] == name and r["server"] == "stagewise"]
        on = next(r for r in ours if r["prefix_cache"])
        off = next(r for r in ours if not r["prefix_cache"])
        ratios[name] = {"wall_off_over_on": off["wall_s"] / on["wall_s"],
                        "ttft_p50_off_over_on": off["ttft_p50_s"] / on["ttft_p50_s"]}
        line = (f"{name}: wall time off/on {ratios[name]['wall_off_over_on']:.2f}x, "
                f"TTFT p50 off/on {ratios[name]['ttft_p50_off_over_on']:.2f}x")
        peer = next((r for r in rows if r["workload"] == name and r["server"] != "stagewise"), None)
        if peer is not None:
            ratios[name]["ttft_p50_peer_over_on"] = peer["ttft_p50_s"] / on["ttft_p50_s"]
            ratios[name]["wall_peer_over_on"] = peer["wall_s"] / on["wall_s"]
            line += (f"; {args.peer_name}/ours (cache on): TTFT p50 {ratios[name]['ttft_p50_peer_over_on']:.2f}x, "
                     f"wall {ratios[name]['wall_peer_over_on']:.2f}x")
        print(line)
    if args.json:
        out = {"command": " ".join(["python3", *sys.argv]), "machine": platform.node(), "platform": platform.platform(),
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows, "ratios": ratios}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
