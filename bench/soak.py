"""Soak: mixed valid and hostile traffic against a served model for a bounded time (issue 31).

Starts ``stagewise serve`` on a random-weight preset, times a valid streamed completion alone, then
runs for ``--duration-s``: valid streams in a loop, and hostile clients: abuse bodies (bad JSON,
unsatisfiable schemas, nameless tools, lone surrogates, 3.9 MB prompts), clients that disconnect
mid-stream, a connect/reset storm, idle and partial-header sockets, bodies trickled a byte at a time. Reports requests served,
refused by status and code, 5xx responses, the valid streams' p50/p99 latency against alone, and
whether queue depth, active sequences and the server's memory return to their baseline after the
traffic stops. Prints a table; writes JSON under bench/results/.

The hostile clients run in a process of their own: a valid client does not share its interpreter (and
GIL) with the attackers, so what the valid streams' time measures is the server. ``--without`` leaves
kinds of hostile traffic out, to see which one costs the valid streams what.

    python bench/soak.py --duration-s 30 --out bench/results/soak_cpu.json
    python bench/soak.py --duration-s 15 --without storm,huge --out /tmp/soak_no_storm.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from multiprocessing.connection import Connection
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
]
_HUGE: list[bytes] = [
    json.dumps({"messages": [{"role": "user", "content": HUGE}], "max_tokens": 2}).encode(),
    json.dumps({"prompt": HUGE, "max_tokens": 2}).encode(),
]
KINDS = ("abuse", "huge", "disconnect", "storm", "idle", "slowbody")  # what --without can leave out
IDLE_SOCKETS = 200  # idle and partial-header sockets held open through the run
SLOW_BODIES = 8  # clients trickling a body at once, each reconnecting when cut off


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def _processes(pid: int) -> list[tuple[str, int]]:
    """``pid`` and its descendants (the engine process serve spawns), as (role, pid): the server itself is
    ``api``, its children ``child1``, ``child2``, ... in the order /proc lists them."""
    found, pending = [("api", pid)], [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append((f"child{len(found)}", child))
                pending.append(child)
    return found


def _rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants together."""
    total = 0
    for _, proc in _processes(pid):
        try:
            lines = Path(f"/proc/{proc}/status").read_text().splitlines()
        except OSError:
            continue  # it ended
        total += next((int(line.split()[1]) * 1024 for line in lines if line.startswith("VmRSS:")), 0)
    return total


def _cpu_s(pid: int, descendants: bool = True) -> dict[str, float]:
    """CPU seconds (user + system) each thread of ``pid`` (and of its descendants) has used, by process role
    and thread name (``api:python``, ``child1:python``; names repeated: summed)."""
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for role, proc in _processes(pid) if descendants else [("api", pid)]:
        try:
            tasks = list(Path(f"/proc/{proc}/task").iterdir())
        except OSError:
            continue  # it ended
        for task in tasks:
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue  # the thread ended
            name = f"{role}:{stat[stat.index('(') + 1:stat.rindex(')')]}"
            fields = stat[stat.rindex(")") + 2:].split()
            used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) * tick_s  # utime + stime
    return used


def _cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 2) for name in sorted(after)
            if after[name] - before.get(name, 0.0) >= 0.01}


def _stream(url: str, max_tokens: int) -> tuple[float, int, int, float, float]:
    """One valid streamed chat: (seconds, completion chunks, status, seconds to the first chunk, longest gap
    between chunks in seconds)."""
    body = {"messages": HELLO, "max_tokens": max_tokens, "temperature": 0.8, "seed": 1, "stream": True}
    started = time.monotonic()
    chunks = 0
    first_s = gap_s = 0.0
    last = started
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                now = time.monotonic()
                first_s = first_s or now - started
                gap_s = max(gap_s, now - last) if chunks else gap_s
                chunks, last = chunks + 1, now
        status = r.status_code
    return time.monotonic() - started, chunks, status, first_s, gap_s


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.valid_s: list[float] = []
        self.first_s: list[float] = []  # the valid streams' time to the first chunk
        self.gap_s: list[float] = []  # and longest gap between chunks
        self.errors: list[str] = []

    def add(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] += 1


def _abuser(url: str, stop: threading.Event, tally: Tally, index: int, bodies: list[bytes]) -> None:
    n = index
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            body = bodies[n % len(bodies)]
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


def _slow_body(port: int, stop: threading.Event, tally: Tally) -> None:
    """Headers, then a body trickled a byte every 0.2 s, until the server answers (408) and closes."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{")
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
                sock.sendall(head)
                sock.settimeout(0.2)
                reply = b""
                while True:
                    try:
                        chunk = sock.recv(4096)
                    except TimeoutError:
                        sock.sendall(b" ")
                        continue
                    if not chunk:
                        break
                    reply += chunk
                tally.add(f"slow body {reply[9:12].decode() or 'closed'}")
        except OSError as exc:
            tally.add(f"slow body transport {type(exc).__name__}")


def _idlers(port: int, count: int) -> list[socket.socket]:
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(sock)
    return socks


def _hostile(url: str, port: int, kinds: tuple[str, ...], duration_s: float, conn: Connection) -> None:
    """The hostile clients of ``kinds`` for ``duration_s`` (run in a process of its own); sends back the
    counts by kind and how many idle/partial sockets the server closed."""
    tally = Tally()
    stop = threading.Event()
    idle = _idlers(port, IDLE_SOCKETS) if "idle" in kinds else []
    bodies = [*(_ABUSE if "abuse" in kinds else []), *(_HUGE if "huge" in kinds else [])]
    threads = [*(threading.Thread(target=_abuser, args=(url, stop, tally, i, bodies)) for i in range(3) if bodies),
               *([threading.Thread(target=_disconnecter, args=(url, stop, tally))] if "disconnect" in kinds else []),
               *([threading.Thread(target=_storm, args=(port, stop, tally))] if "storm" in kinds else []),
               *(threading.Thread(target=_slow_body, args=(port, stop, tally)) for _ in range(SLOW_BODIES)
                 if "slowbody" in kinds)]
    conn.send("started")
    for thread in threads:
        thread.start()
    time.sleep(duration_s)
    stop.set()
    for thread in threads:
        thread.join(180)
    closed = 0
    for sock in idle:
        sock.settimeout(5)
        try:
            closed += sock.recv(16) == b""
        except OSError:
            pass
        sock.close()
    conn.send((dict(tally.counts), closed))



def _valid(url: str, stop: threading.Event, tally: Tally, max_tokens: int) -> None:
    while not stop.is_set():
        try:
            seconds, _, status, first_s, gap_s = _stream(url, max_tokens)
            tally.add(f"valid {status}")
            if status == 200:
                with tally.lock:
                    tally.valid_s.append(seconds)
                    tally.first_s.append(first_s)
                    tally.gap_s.append(gap_s)
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
    parser.add_argument("--without", default="", help=f"comma-separated hostile kinds to leave out: {', '.join(KINDS)}")
    parser.add_argument("--serve-args", default="", help="more arguments for stagewise serve, e.g. '--workers local'")
    parser.add_argument("--server-cwd", default=str(REPO),
                        help="the checkout whose stagewise serves (another branch's worktree, to compare)")
    parser.add_argument("--out", default=str(REPO / "bench/results/soak_cpu.json"))
    args = parser.parse_args()
    left_out = tuple(k for k in args.without.split(",") if k)
    if unknown := set(left_out) - set(KINDS):
        parser.error(f"--without: unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    kinds = tuple(k for k in KINDS if k not in left_out)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = Path(args.out).with_suffix(".log")
    command = [sys.executable, "-m", "stagewise", "serve", args.model, "--placement", "single", "--port", str(port),
               "--context", "1024", "--header-timeout-s", "2", "--queue", "16",
               *(["--body-timeout-s", "2"] if "slowbody" in kinds else []), *args.serve_args.split()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": args.server_cwd}
    server = subprocess.Popen(command, cwd=args.server_cwd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
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
        ours, theirs = multiprocessing.get_context("spawn").Pipe()
        hostile = multiprocessing.get_context("spawn").Process(
            target=_hostile, args=(url, port, kinds, args.duration_s, theirs), daemon=True)
        hostile.start()
        if ours.recv() != "started":
            raise SystemExit("the hostile clients did not start")
        valid = threading.Thread(target=_valid, args=(url, stop, tally, args.max_tokens))
        cpu_before = _cpu_s(server.pid), _cpu_s(hostile.pid or 0), _cpu_s(os.getpid(), descendants=False)
        valid.start()
        time.sleep(args.duration_s)
        cpu_after = _cpu_s(server.pid), _cpu_s(hostile.pid or 0), _cpu_s(os.getpid(), descendants=False)
        stop.set()
        stopped = time.monotonic()
        valid.join(180)
        counts_hostile, idle_closed = ours.recv()
        hostile.join(60)
        joined_s = time.monotonic() - stopped
        tally.counts.update(counts_hostile)
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
        "server_cwd": args.server_cwd,
        "server_commit": subprocess.run(["git", "-C", args.server_cwd, "describe", "--always", "--dirty"],
                                        capture_output=True, text=True).stdout.strip(),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "duration_s": args.duration_s,
        "hostile_kinds": list(kinds),
        "valid_stream_alone_s": alone_s,
        "valid_stream_tokens": alone[0][1],
        "valid_streams_under_mix": len(tally.valid_s),
        "valid_p50_s": p50,
        "valid_p99_s": p99,
        "p99_over_alone": p99 / alone_s,
        "valid_first_chunk_alone_s": sorted(a[3] for a in alone)[1],
        "valid_first_chunk_p50_s": _percentile(tally.first_s, 0.5),
        "valid_first_chunk_p99_s": _percentile(tally.first_s, 0.99),
        "valid_longest_gap_alone_s": sorted(a[4] for a in alone)[1],
        "valid_longest_gap_p99_s": _percentile(tally.gap_s, 0.99),
        "valid_streams_s": [{"total": round(t, 4), "first_chunk": round(f, 4), "longest_gap": round(g, 4)}
                            for t, f, g in zip(tally.valid_s, tally.first_s, tally.gap_s, strict=True)],
        "after_mix_stream_s": after[0],
        "counts": counts,
        "responses_5xx": five_xx,
        "idle_sockets": IDLE_SOCKETS if "idle" in kinds else 0,
        "idle_sockets_closed_by_server": idle_closed,
        "clients_joined_s": joined_s,
        "queue_depth_after": queue,
        "active_sequences_after": active,
        "settled_within_s": settle_s,
        "cpu_s_during_mix": {"server_threads": _cpu_delta(cpu_before[0], cpu_after[0]),
                             "hostile_clients": round(sum(cpu_after[1].values()) - sum(cpu_before[1].values()), 2),
                             "valid_client": round(sum(cpu_after[2].values()) - sum(cpu_before[2].values()), 2),
                             "cores": os.cpu_count(), "duration_s": args.duration_s},
        "rss_before_bytes": rss_before,
        "rss_after_bytes": rss_after,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'valid stream alone':<34} {alone_s:8.2f} s ({alone[0][1]} chunks)")
    print(f"{'valid streams under the mix':<34} {len(tally.valid_s):8d}   p50 {p50:.2f} s  p99 {p99:.2f} s "
          f"({p99 / alone_s:.2f}x alone)")
    print(f"{'  first chunk / longest gap':<34} alone {result['valid_first_chunk_alone_s']:.3f} / "
          f"{result['valid_longest_gap_alone_s']:.3f} s, under the mix p50 {result['valid_first_chunk_p50_s']:.3f}, "
          f"p99 {result['valid_first_chunk_p99_s']:.3f} / p99 {result['valid_longest_gap_p99_s']:.3f} s")
    for kind, n in counts.items():
        print(f"  {kind:<60} {n:8d}")
    print(f"{'5xx responses':<34} {five_xx:8d}")
    print(f"{'hostile kinds':<34} {', '.join(kinds) or '(none)'}")
    print(f"{'idle/partial sockets closed':<34} {idle_closed:8d} / {result['idle_sockets']}")
    print(f"{'queue depth / active after':<34} {queue:g} / {active:g} (settled in {settle_s:.2f} s)")
    cpu = result["cpu_s_during_mix"]
    print(f"{'CPU s during the mix':<34} server {cpu['server_threads']}, hostile clients {cpu['hostile_clients']}, "
          f"valid client {cpu['valid_client']} (of {os.cpu_count()} cores x {args.duration_s:g} s)")
    print(f"{'server RSS before / after':<34} {rss_before / 2**20:.0f} / {rss_after / 2**20:.0f} MiB")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
