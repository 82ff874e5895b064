"""The worker control plane: loopback by default, every message signed and checked (the row
operations of continuous batching too), replays refused, nothing of a refused message applied, a
lost worker visible in /health, and a malformed ``--workers`` refused before anything is opened.

The first tests need no worker process (a pool, raw ZeroMQ sockets playing the stranger, a worker's
command loop over a socket the test drives); the last ones start two local workers (gloo on CPU)
once for the module.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
import zmq
from starlette.testclient import TestClient

from stagewise.cli import main as cli
from stagewise.engine.engine import Engine
from stagewise.engine.load_settings import LoadSettings
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.errors import ConfigError, WorkerMessageRejected, WorkerNotJoined
from stagewise.runtime.coordinator_plane import routing_id
from stagewise.runtime.distributed_start import open_pool
from stagewise.runtime.message_seal import MessageSeal
from stagewise.runtime.remote_pipeline import DistributedPipeline
from stagewise.runtime.worker import Worker
from stagewise.runtime.worker_messages import (
    Ack,
    Assignment,
    Down,
    Exit,
    Heartbeat,
    JoinReport,
    Publish,
    Reset,
    Rollback,
    Run,
    Up,
)
from stagewise.runtime.worker_mode import WorkerMode
from stagewise.runtime.worker_plane import WorkerPlane
from stagewise.runtime.worker_pool import WorkerPool
from stagewise.runtime.worker_secret import SECRET_ENV
from stagewise.runtime.worker_segment import SegmentResult
from stagewise.server.app import guarded_app
from stagewise.server.engine_front import LocalEngine
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from tests.multiprocess_helpers import PROMPT
from tests.test_server_support import make_model_dir

INCARNATION = "0123456789abcdef" * 2
CONTEXT = 48
WAIT_S = 10.0  # an upper bound only: every wait below ends on the event it waits for


def _listening(port: int) -> list[str]:
    """The local addresses the kernel has a listening TCP socket on for ``port`` (hex, as in /proc)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.append(address)
    return found


class Stranger:
    """A process that reached the coordinator's control plane: a DEALER of its own."""

    def __init__(self, pool: WorkerPool, identity: bytes = b"stranger") -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, identity)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{pool.plane.port}")

    def send(self, blob: bytes) -> None:
        self.sock.send(blob)


def _seal(kind: Any, pool: WorkerPool, secret: bytes | None = None, session: str | None = None) -> MessageSeal[Any]:
    return MessageSeal(secret or pool.secret, session or pool.session, kind, "test", log=lambda _: None)


def _refused(pool: WorkerPool, before: int, count: int) -> None:
    """Wait until the plane has refused ``count`` more messages than ``before``."""
    assert pool.plane.wait(lambda: pool.plane.rejected >= before + count, WAIT_S), pool.plane.rejected - before


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    p = open_pool("local", timeout_s=5)
    yield p
    p.close(grace_s=0)


# ----- where the store and the plane listen -------------------------------------------------------


def test_local_store_and_plane_listen_on_loopback_only(pool: WorkerPool) -> None:
    assert pool.listen_address == ("127.0.0.1", pool.port)
    assert _listening(pool.port) == ["0100007F"]  # 127.0.0.1 as /proc writes it; no wildcard socket
    assert _listening(pool.plane.port) == ["0100007F"]


def test_remote_store_listens_where_told_and_needs_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv("STAGEWISE_WORKER_SECRET_FILE", raising=False)
    with pytest.raises(ConfigError, match="shared secret"):
        open_pool("1@127.0.0.1:0")
    assert WorkerMode.parse("2@:29500").host == "127.0.0.1"  # no HOST: loopback, never every interface
    monkeypatch.setenv(SECRET_ENV, "short")
    with pytest.raises(ConfigError, match="too short"):
        open_pool("1@127.0.0.1:0")
    monkeypatch.setenv(SECRET_ENV, "x" * 32)
    remote = open_pool("1@127.0.0.1:0")
    try:
        assert _listening(remote.port) == ["0100007F"] and _listening(remote.plane.port) == ["0100007F"]
    finally:
        remote.close(grace_s=0)


# ----- joining --------------------------------------------------------------------------------------


def test_stranger_without_the_secret_cannot_join(pool: WorkerPool, capsys: pytest.CaptureFixture[str]) -> None:
    stranger, before = Stranger(pool), pool.plane.rejected
    report = JoinReport(rank=1, incarnation=INCARNATION, pid=4242, host="evil", topology={})
    stranger.send(msgspec.msgpack.encode(report))  # unsigned
    stranger.send(_seal(Up, pool, secret=b"not-the-secret-of-this-pool!").seal(report))  # another secret
    _refused(pool, before, 2)
    assert pool.report(1) is None and pool.members == {}
    with pytest.raises(WorkerNotJoined):
        pool.wait_joins([1], 0.3)
    err = capsys.readouterr().err
    assert "stagewise coordinator: rejected a message: unsigned" in err and "bad signature" in err


def test_join_of_another_session_or_a_replayed_incarnation_is_refused(pool: WorkerPool) -> None:
    worker, before = Stranger(pool, routing_id(1, INCARNATION)), pool.plane.rejected
    first = JoinReport(rank=1, incarnation=INCARNATION, pid=1, host="h", topology={})
    worker.send(_seal(Up, pool, session="f" * 32).seal(first))  # the same secret, an earlier pool's session
    _refused(pool, before, 1)
    assert pool.report(1) is None
    signed = _seal(Up, pool).seal(first)
    worker.send(signed)
    assert pool.plane.wait(lambda: pool.fresh_join(1) is not None, WAIT_S)
    pool.admit(pool.fresh_join(1))  # type: ignore[arg-type]
    stranger = Stranger(pool)
    stranger.send(signed)  # the genuine report, replayed from another connection
    _refused(pool, before, 2)
    newer = JoinReport(rank=1, incarnation="f" * 32, pid=2, host="h", topology={})
    restarted = Stranger(pool, routing_id(1, newer.incarnation))
    restarted.send(_seal(Up, pool).seal(newer))
    assert pool.plane.wait(lambda: pool.fresh_join(1) == newer, WAIT_S)
    pool.admit(newer)  # a restart
    worker.send(signed)  # the first report again, signed as it was: a replay
    assert pool.plane.wait(lambda: pool.report(1) == first, WAIT_S)
    assert pool.fresh_join(1) is None


# ----- acknowledgements and heartbeats ---------------------------------------------------------------


def test_forged_or_replayed_acks_and_heartbeats_are_refused(pool: WorkerPool) -> None:
    worker, stranger, before = Stranger(pool, routing_id(1, INCARNATION)), Stranger(pool), pool.plane.rejected
    pool.plane.expect(3, {1: INCARNATION})
    genuine = Ack(seq=3, rank=1, incarnation=INCARNATION, ok=True)
    worker.send(_seal(Up, pool, secret=b"a guessed secret, but not the one").seal(genuine))
    worker.send(_seal(Up, pool).seal(Ack(seq=4, rank=1, incarnation=INCARNATION, ok=True)))  # a command not sent
    other = Stranger(pool, routing_id(1, "e" * 32))
    other.send(_seal(Up, pool).seal(Ack(seq=3, rank=1, incarnation="e" * 32, ok=True)))  # another incarnation
    blob = _seal(Up, pool).seal(genuine)
    stranger.send(blob)  # the genuine answer, from another connection
    _refused(pool, before, 4)
    assert pool.plane.acks(3) == {}
    worker.send(blob)
    assert pool.plane.wait(lambda: pool.plane.acks(3) == {1: genuine}, WAIT_S)
    worker.send(blob)  # replayed while awaited: counted once
    _refused(pool, before, 5)
    assert pool.plane.forget(3) == {1: genuine}
    worker.send(blob)  # replayed later
    _refused(pool, before, 6)
    beats = Stranger(pool, routing_id(1, INCARNATION) + b":beat")
    beat = _seal(Up, pool).seal(Heartbeat(rank=1, incarnation=INCARNATION, n=5))
    beats.send(beat)
    assert pool.plane.wait(lambda: pool.plane.last_beat(INCARNATION) is not None, WAIT_S)
    seen = pool.plane.last_beat(INCARNATION)
    beats.send(beat)  # a replayed heartbeat keeps no dead worker alive
    stranger.send(_seal(Up, pool).seal(Heartbeat(rank=1, incarnation=INCARNATION, n=6)))  # nor one from elsewhere
    _refused(pool, before, 8)
    assert pool.plane.last_beat(INCARNATION) == seen


# ----- a worker applies genuine commands only, each once, in order ------------------------------------


class RecordingSegment:
    """Stands in for a worker's stages: records what the worker applies."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, int]] = []

    def publish(self, step_id: int = 0) -> None:
        self.applied.append(("publish", step_id))

    def rollback(self, step_id: int = 0) -> None:
        self.applied.append(("rollback", step_id))

    def rearrange(self, op: Any) -> None:
        self.applied.append(("reset", op.slot))

    def run(self, cmd: Run) -> SegmentResult:
        self.applied.append(("run", cmd.step_id))
        return SegmentResult(None, [0.001], 0.0)


def test_a_worker_applies_only_genuine_commands_once_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    secret, session, members = b"the-secret-of-this-pool-0123456789", "a" * 32, {1: INCARNATION}
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    plane = WorkerPlane("127.0.0.1", port, secret, session, 1, INCARNATION)
    plane.send(Heartbeat(rank=1, incarnation=INCARNATION, n=1))  # the router learns the worker's routing id
    identity, _ = router.recv_multipart()
    seal: MessageSeal[Down] = MessageSeal(secret, session, Down, "coordinator")
    publish = seal.seal(Publish(seq=1, members=members, step_id=4))
    tampered = bytearray(seal.seal(Rollback(seq=2, members=members, step_id=4)))
    tampered[-1] ^= 1
    for blob in [msgspec.msgpack.encode(Exit(seq=1, members=members)),  # unsigned stop
                 MessageSeal(b"a guessed secret, but not the one", session, Down, "x").seal(Exit(seq=1, members=members)),
                 bytes(tampered), publish, publish,  # the genuine publish, then replayed
                 seal.seal(Run(seq=2, members=members, step_id=5, tokens=[[1]], positions=[[0]], ops=[Reset(slot=0)])),
                 seal.seal(Rollback(seq=3, members={1: "e" * 32}, step_id=5))]:  # another incarnation is trusted
        router.send_multipart([identity, blob])
    worker = Worker(plane, None, None)  # type: ignore[arg-type]  # no store, no model: the segment records
    segment = RecordingSegment()
    worker.segment = segment  # type: ignore[assignment]
    worker.assignment = Assignment(incarnation=INCARNATION, model="m", dtype="float32", batch=1, context=8, stages=(),
                                   gen=0, data_rank=0, data_world=1, backend="gloo", prev_rank=-1, next_rank=-1,
                                   first_seq=1, timeout_s=5.0)
    try:
        assert worker.serve() == 5  # replaced: it leaves without applying the rollback
        assert segment.applied == [("publish", 4), ("reset", 0), ("run", 5)]
        ack: Ack = MessageSeal(secret, session, Up, "coordinator").open(router.recv_multipart()[1])  # type: ignore[assignment]
        assert (ack.seq, ack.ok, ack.stage_s) == (2, True, [0.001])
        err = capsys.readouterr().err
        for why in ("unsigned", "bad signature", "command 1 replayed (last 1)", "replaced by a newer worker"):
            assert why in err
    finally:
        plane.close()
        router.close()


# ----- worker options: checked before anything opens; --max-seqs and --kv-tokens allowed -------------


def test_worker_options_checked_before_anything_opens(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    def opened(*args: object, **kwargs: object) -> None:
        raise AssertionError("something was opened before the options were checked")

    monkeypatch.setattr("stagewise.engine.model_loading.open_model", opened)
    monkeypatch.setattr("stagewise.runtime.distributed_start.open_pool", opened)
    monkeypatch.setattr("stagewise.runtime.worker_pool.WorkerPool.__init__", opened)
    monkeypatch.setattr("stagewise.server.runner.serve", opened)
    with pytest.raises(ConfigError, match="--workers must be"):
        load_model("random:tiny-llama", workers="two@nowhere", max_seqs=2)
    with pytest.raises(ConfigError, match="--workers must be"):
        ServeSettings(LoadSettings(workers="0@127.0.0.1:1", max_seqs=4))
    assert cli.main(["serve", "random:tiny-llama", "--workers", "2@host", "--max-seqs", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stagewise: error: --workers must be") and err.count("\n") == 1
    settings = ServeSettings(LoadSettings(workers="local", max_seqs=4, kv_tokens=256))  # batching through workers is allowed
    assert (settings.load.max_seqs, settings.load.kv_tokens) == (4, 256)


# ----- two real local workers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    path = make_model_dir(tmp_path_factory.mktemp("security"))  # with a tokenizer: the engine serves it
    model = load_model(str(path), devices="cpu:2x1GiB", placement="pipeline:2", context=CONTEXT, dtype="float32",
                       workers="local", worker_timeout_s=20, rejoin=False, max_seqs=None)  # auto: many rows
    yield model
    model.close()


def _greedy(pipeline: DistributedPipeline) -> list[int]:
    pipeline.reset(0)
    out = pipeline.step(torch.tensor([PROMPT]), torch.arange(len(PROMPT))[None], start=0)
    assert out.logits is not None
    return [int(out.logits[0, -1].argmax())]


def test_local_workers_ignore_forged_answers(loaded: LoadedModel) -> None:
    """A stranger on the plane answers in the workers' place (a failed step, a join replacing worker 2):
    refused, the coordinator's own workers answer and nothing changes."""
    pipeline = loaded.pipeline
    assert isinstance(pipeline, DistributedPipeline)
    pool = pipeline.pool
    expected = _greedy(pipeline)
    members, before = pool.incarnations(), pool.plane.rejected
    stranger = Stranger(pool)
    for rank, inc in members.items():
        stranger.send(msgspec.msgpack.encode(Ack(seq=pipeline.commands.seq, rank=rank, incarnation=inc, ok=False,
                                                 error="forged", error_type="WorkerLost")))
    stranger.send(msgspec.msgpack.encode(JoinReport(rank=2, incarnation="e" * 32, pid=1, host="evil", topology={})))
    _refused(pool, before, len(members) + 1)
    assert _greedy(pipeline) == expected
    assert pool.incarnations() == members and pipeline.health()["status"] == "ok"


def test_workers_hold_the_rows_and_pool_and_check_row_operations(loaded: LoadedModel) -> None:
    """Auto --max-seqs: the workers hold the planned rows and KV pool; a row operation naming a row or a
    block they do not hold is refused before any stage changes (by the coordinator before it
    rides on the next run, and again by every worker)."""
    pipeline = loaded.pipeline
    assert isinstance(pipeline, DistributedPipeline)
    rows, pool = pipeline.rows, pipeline.kv_pool
    assert rows == loaded.placement_json["profile"]["batch"] > 1 and pool.blocks == rows * pool.blocks_per_row
    expected = _greedy(pipeline)
    for bad, match in [(lambda: pipeline.reset(rows), "reset: rows"),
                       (lambda: pipeline.set_blocks(0, [pool.blocks]), "set_blocks: 1 block ids"),
                       (lambda: pipeline.set_blocks(0, range(pool.blocks_per_row + 1)), "set_blocks"),
                       (lambda: pipeline.move(0, rows), "move: rows"),
                       (lambda: pipeline.move(rows + 1, 0), "move: rows")]:
        with pytest.raises(WorkerMessageRejected, match=match):
            bad()
    assert not pipeline.degraded
    assert _greedy(pipeline) == expected  # nothing changed: row 0 still holds its blocks


def test_workers_check_a_step_against_their_stages(loaded: LoadedModel) -> None:
    pipeline = loaded.pipeline
    assert isinstance(pipeline, DistributedPipeline)
    expected = _greedy(pipeline)
    pipeline.reset(0)
    with pytest.raises(WorkerMessageRejected, match="outside the vocabulary"):
        pipeline.step(torch.tensor([[loaded.config.vocab_size]]), torch.tensor([[0]]), start=0)
    with pytest.raises(WorkerMessageRejected, match="outside the context"):
        pipeline.step(torch.tensor([[1]]), torch.tensor([[CONTEXT]]), start=CONTEXT)
    assert _greedy(pipeline) == expected  # rolled back, still serving


def test_row_operations_ride_on_the_next_run_and_workers_check_them_again(loaded: LoadedModel) -> None:
    """Row operations cost no command of their own: they ride on the next run, which every worker
    applies them before. One that got past the coordinator's check (put in its queue directly here)
    is refused by the workers with the step: a typed error naming a worker, nothing degraded."""
    pipeline = loaded.pipeline
    assert isinstance(pipeline, DistributedPipeline)
    expected = _greedy(pipeline)
    seq = pipeline.commands.seq
    pipeline.reset(0)
    pipeline.reset(1)
    assert pipeline.commands.seq == seq and len(pipeline._row_ops) == 2  # nothing sent yet
    pipeline._row_ops.append(Reset(slot=pipeline.rows))  # past the coordinator's check
    with pytest.raises(WorkerMessageRejected, match=r"worker \d .*reset: rows"):
        pipeline.step(torch.tensor([PROMPT]), torch.arange(len(PROMPT))[None], start=0)
    assert not pipeline.degraded and pipeline._row_ops == []
    assert _greedy(pipeline) == expected

def test_health_reports_a_killed_worker(loaded: LoadedModel) -> None:
    pipeline = loaded.pipeline
    assert isinstance(pipeline, DistributedPipeline)
    state = ServerState(ServeSettings(LoadSettings(workers="local", max_seqs=1)))
    assert state.set_ready(LocalEngine(loaded, Engine(loaded, max_waiting=4)))
    with TestClient(guarded_app(state), base_url="http://testserver") as http:
        assert http.get("/health").json() == {"status": "ok"}
        victim = next(w for w in pipeline.health()["workers"] if w["rank"] == 2)
        os.kill(victim["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        # the exited process is reported at once (503, degraded), the pipeline's failure when its watcher
        # marks it: wait on that state, not on the first 503
        while (response := http.get("/health")).json()["status"] != "failed" and time.monotonic() < deadline:
            assert response.status_code == 200 or response.json()["status"] == "degraded", response.json()
            time.sleep(0.1)
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "failed"
    assert f"worker 2 (pid {victim['pid']}" in body["message"] and "stages [1]" in body["message"]
    assert [w["alive"] for w in body["workers"]] == [True, False]
