"""Soak: mixed valid and hostile traffic against a served model for a bounded time (issue 31).

Starts ``stagewise serve`` on a random-weight preset, times a valid streamed completion alone, then
runs for ``--duration-s``: valid streams in a loop, and hostile clients: abuse bodies (bad JSON,
unsatisfiable schemas, nameless tools, lone surrogates, 3.9 MB prompts), clients that disconnect
mid-stream, a connect/reset storm, idle and partial-header sockets. Reports requests served,
refused by status and code, 5xx responses, the valid streams' p50/p99 latency against alone, and
whether queue depth, active sequences and the server's memory return to their baseline after the
traffic stops. Prints a table; writes JSON under bench/results/.

    python bench/soak.py --duration-s 30 --out bench/results/soak_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
HELLO = [{"role": "user", "content": "Tell me a story about a robot."}]
HUGE = "word " * 780_000  # 3.9 MB, under the 4 MiB body limit
_ABUSE: list[bytes] = [
    b'{"messages": [',
    b'\xff\xfe{}',
    b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    json.dumps({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#"}}}, "stream": True}).encode(),
    json.dumps({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}}}).encode(),
    json.dumps({"messages": HELLO, "tools": [{"type": "function", "function": {}}]}).encode(),
    b'{"messages": [{"role": "user", "content": "hi"}], "x\\ud800": 1}',
    b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",
    json.dumps({"messages": [{"role": "user", "content": HUGE}], "max_tokens": 2}).encode(),
    json.dumps({"prompt": HUGE, "max_tokens": 2}).encode(),
]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _stream(url: str, max_tokens: int) -> tuple[float, int, int]:
    """One valid streamed chat: (seconds, completion chunks, status)."""
    body = {"messages": HELLO, "max_tokens": max_tokens, "temperature": 0.8, "seed": 1, "stream": True}
    started = time.monotonic()
    chunks = 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks += 1
        status = r.status_code
    return time.monotonic() - started, chunks, status


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.valid_s: list[float] = []
        self.errors: list[str] = []

    def add(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] += 1


def _abuser(url: str, stop: threading.Event, tally: Tally, index: int) -> None:
    n = index
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            body = _ABUSE[n % len(_ABUSE)]
            n += 1
            path = "/v1/completions" if b'"prompt"' in body[:40] else "/v1/chat/completions"
            try:
                r = client.post(f"{url}{path}", content=body, headers={"Content-Type": "application/json"})
                code = r.json().get("error", {}).get("code") if r.headers.get("content-type", "").startswith(
                    "application/json") else None
                tally.add(f"abuse {r.status_code} {code}")
            except httpx.HTTPError as exc:
                tally.add(f"abuse transport {type(exc).__name__}")


def _disconnecter(url: str, stop: threading.Event, tally: Tally) -> None:
    body = {"messages": HELLO, "max_tokens": 200, "stream": True}
    while not stop.is_set():
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        break  # leave after the first chunk
                tally.add(f"disconnect after first chunk ({r.status_code})")
        except httpx.HTTPError as exc:
            tally.add(f"disconnect transport {type(exc).__name__}")


def _storm(port: int, stop: threading.Event, tally: Tally) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    n = 0
    while not stop.is_set():
        n += 1
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                if n % 3 == 0:
                    sock.sendall(request)
                    sock.recv(1024)
                    tally.add("storm full request")
                else:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    tally.add("storm reset")
        except OSError:
            tally.add("storm refused")


def _idlers(port: int, count: int) -> list[socket.socket]:
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(sock)
    return socks


def _valid(url: str, stop: threading.Event, tally: Tally, max_tokens: int) -> None:
    while not stop.is_set():
        try:
            seconds, _, status = _stream(url, max_tokens)
            tally.add(f"valid {status}")
            if status == 200:
                with tally.lock:
                    tally.valid_s.append(seconds)
        except httpx.HTTPError as exc:
            tally.add(f"valid transport {type(exc).__name__}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:tiny-llama")
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--idle-sockets", type=int, default=200)
    parser.add_argument("--out", default=str(REPO / "bench/results/soak_cpu.json"))
    args = parser.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = Path(args.out).with_suffix(".log")
    command = [sys.executable, "-m", "stagewise", "serve", args.model, "--placement", "single", "--port", str(port),
               "--context", "1024", "--header-timeout-s", "2", "--queue", "16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(command, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        _stream(url, 8)  # first request: lazy setup out of the way
        alone = [_stream(url, args.max_tokens) for _ in range(3)]
        alone_s = sorted(a[0] for a in alone)[1]
        rss_before = _rss_bytes(server.pid)

        tally = Tally()
        stop = threading.Event()
        idle = _idlers(port, args.idle_sockets)
        threads = [threading.Thread(target=_valid, args=(url, stop, tally, args.max_tokens)),
                   *(threading.Thread(target=_abuser, args=(url, stop, tally, i)) for i in range(3)),
                   threading.Thread(target=_disconnecter, args=(url, stop, tally)),
                   threading.Thread(target=_storm, args=(port, stop, tally))]
        for thread in threads:
            thread.start()
        time.sleep(args.duration_s)
        stop.set()
        stopped = time.monotonic()
        for thread in threads:
            thread.join(180)
        joined_s = time.monotonic() - stopped
        idle_closed = 0
        for sock in idle:
            sock.settimeout(5)
            try:
                idle_closed += sock.recv(16) == b""
            except OSError:
                pass
            sock.close()
        settle_start = time.monotonic()
        while (_metric(url, "stagewise_queue_depth") or _metric(url, "stagewise_active_sequences")) \
                and time.monotonic() - settle_start < 30:
            time.sleep(0.05)
        settle_s = time.monotonic() - settle_start
        queue, active = _metric(url, "stagewise_queue_depth"), _metric(url, "stagewise_active_sequences")
        rss_after = _rss_bytes(server.pid)
        after = _stream(url, args.max_tokens)
    finally:
        server.terminate()
        server.wait(60)

    counts = dict(sorted(tally.counts.items()))
    five_xx = sum(n for k, n in counts.items() if any(f" {c}" in k for c in range(500, 600)))
    p50, p99 = _percentile(tally.valid_s, 0.5), _percentile(tally.valid_s, 0.99)
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "server_command": " ".join(command[1:]),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "duration_s": args.duration_s,
        "valid_stream_alone_s": alone_s,
        "valid_stream_tokens": alone[0][1],
        "valid_streams_under_mix": len(tally.valid_s),
        "valid_p50_s": p50,
        "valid_p99_s": p99,
        "p99_over_alone": p99 / alone_s,
        "after_mix_stream_s": after[0],
        "counts": counts,
        "responses_5xx": five_xx,
        "idle_sockets": args.idle_sockets,
        "idle_sockets_closed_by_server": idle_closed,
        "clients_joined_s": joined_s,
        "queue_depth_after": queue,
        "active_sequences_after": active,
        "settled_within_s": settle_s,
        "rss_before_bytes": rss_before,
        "rss_after_bytes": rss_after,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'valid stream alone':<34} {alone_s:8.2f} s ({alone[0][1]} chunks)")
    print(f"{'valid streams under the mix':<34} {len(tally.valid_s):8d}   p50 {p50:.2f} s  p99 {p99:.2f} s "
          f"({p99 / alone_s:.2f}x alone)")
    for kind, n in counts.items():
        print(f"  {kind:<60} {n:8d}")
    print(f"{'5xx responses':<34} {five_xx:8d}")
    print(f"{'idle/partial sockets closed':<34} {idle_closed:8d} / {args.idle_sockets}")
    print(f"{'queue depth / active after':<34} {queue:g} / {active:g} (settled in {settle_s:.2f} s)")
    print(f"{'server RSS before / after':<34} {rss_before / 2**20:.0f} / {rss_after / 2**20:.0f} MiB")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
