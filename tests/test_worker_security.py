"""The worker rendezvous store: loopback by default, every message signed and checked (the row
operations of continuous batching too), a lost worker visible in /health, and a malformed
``--workers`` refused before anything is opened.

The first tests need no worker process (a pool, raw store clients playing the stranger); the last
ones start two local workers (gloo on CPU) once for the module.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from starlette.testclient import TestClient

from stagewise.cli import main as cli
from stagewise.engine.engine import Engine
from stagewise.engine.load_settings import LoadSettings
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.errors import ConfigError, WorkerMessageRejected, WorkerNotJoined
from stagewise.runtime.distributed_start import open_pool
from stagewise.runtime.remote_pipeline import DistributedPipeline
from stagewise.runtime.sealed_store import SealedStore
from stagewise.runtime.worker import open_session, read_command
from stagewise.runtime.worker_messages import (
    Ack,
    Assignment,
    Command,
    JoinReport,
    cmd_key,
    join_key,
    out_key,
    tensor_from_bytes,
    tensor_to_bytes,
)
from stagewise.runtime.worker_mode import WorkerMode
from stagewise.runtime.worker_pool import WorkerPool
from stagewise.runtime.worker_secret import SECRET_ENV
from stagewise.server.app import guarded_app
from stagewise.server.engine_front import LocalEngine
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from tests.multiprocess_helpers import PROMPT
from tests.test_server_support import make_model_dir

INCARNATION = "0123456789abcdef" * 2
CONTEXT = 48


def _stranger(pool: WorkerPool) -> dist.TCPStore:
    """A process that reached the store's port but has no secret."""
    return dist.TCPStore("127.0.0.1", pool.port, None, False, timedelta(seconds=5))


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


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    p = open_pool("local", timeout_s=5)
    yield p
    p.close(grace_s=0)


# ----- where the store listens --------------------------------------------------------------------


def test_local_store_listens_on_loopback_only(pool: WorkerPool) -> None:
    assert pool.listen_address == ("127.0.0.1", pool.port)
    assert _listening(pool.port) == ["0100007F"]  # 127.0.0.1 as /proc writes it; no wildcard socket


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
        assert _listening(remote.port) == ["0100007F"]
    finally:
        remote.close(grace_s=0)


# ----- joining --------------------------------------------------------------------------------------


def test_stranger_without_the_secret_cannot_join(pool: WorkerPool, capsys: pytest.CaptureFixture[str]) -> None:
    stranger = _stranger(pool)
    report = JoinReport(1, INCARNATION, 4242, "evil", {})
    stranger.set(join_key(1), report.to_json())  # unsigned
    assert pool.report(1) is None
    with pytest.raises(WorkerNotJoined):
        pool.wait_joins([1], 0.3)
    assert "stagewise coordinator: rejected the message at 'join/1': unsigned" in capsys.readouterr().err
    wrong = SealedStore(stranger, b"not-the-secret-of-this-pool!", pool.session, "stranger")
    wrong.set(join_key(1), report.to_json())  # signed, with another secret
    assert pool.report(1) is None
    assert "bad signature" in capsys.readouterr().err
    assert pool.members == {}


def test_join_of_another_session_or_a_replayed_incarnation_is_refused(pool: WorkerPool) -> None:
    raw = _stranger(pool)
    earlier = SealedStore(raw, pool.secret, "f" * 32, "old")  # the same secret, an earlier pool's session
    earlier.set(join_key(1), JoinReport(1, INCARNATION, 1, "h", {}).to_json())
    assert pool.report(1) is None
    worker = SealedStore(raw, pool.secret, pool.session, "worker 1")
    signed = JoinReport(1, INCARNATION, 1, "h", {}).to_json()
    worker.set(join_key(1), signed)
    first = pool.fresh_join(1)
    assert first is not None
    pool.admit(first)
    newer = JoinReport(1, "f" * 32, 2, "h", {})
    worker.set(join_key(1), newer.to_json())
    pool.admit(pool.fresh_join(1))  # type: ignore[arg-type]  # a restart
    worker.set(join_key(1), signed)  # the first report again, signed as it was: a replay
    assert pool.fresh_join(1) is None


# ----- commands -------------------------------------------------------------------------------------


def test_stranger_cannot_inject_a_stop_or_step(pool: WorkerPool, capsys: pytest.CaptureFixture[str]) -> None:
    worker = open_session(_stranger(pool), pool.secret, 1, 5)
    stranger = _stranger(pool)
    members = {1: INCARNATION}
    stranger.set(cmd_key(0), Command(0, "exit", members).to_json())  # unsigned stop
    real = Command(0, "run", members, step_id=1, tokens=[[5]], positions=[[0]], expected_acks=1)
    threading.Timer(0.3, lambda: pool.store.set(cmd_key(0), real.to_json())).start()
    assert read_command(worker, 0) == real  # the forged stop was skipped, the coordinator's step read
    assert "stagewise worker 1: rejected the message at 'cmd/0': unsigned" in capsys.readouterr().err
    stranger.set(cmd_key(1), bytes(stranger.get(cmd_key(0))))  # the genuine step, replayed as command 1
    threading.Timer(0.3, lambda: pool.store.set(cmd_key(1), Command(1, "publish", members).to_json())).start()
    assert read_command(worker, 1).op == "publish"
    assert "rejected the message at 'cmd/1': bad signature" in capsys.readouterr().err


def test_forged_or_tampered_messages_are_rejected(pool: WorkerPool) -> None:
    raw = _stranger(pool)
    genuine = SealedStore(raw, pool.secret, pool.session, "worker 1", log=lambda _: None)
    forger = SealedStore(raw, b"a guessed secret, but not the one", pool.session, "stranger", log=lambda _: None)
    forger.set("ack/3/1", Ack(1, True).to_json())
    with pytest.raises(WorkerMessageRejected, match="bad signature"):
        genuine.get("ack/3/1")
    blob = bytearray(genuine.seal("ack/3/1", Ack(1, True).to_json()))
    blob[-3] ^= 1  # one bit of the payload
    raw.set("ack/3/1", bytes(blob))
    with pytest.raises(WorkerMessageRejected, match="bad signature"):
        genuine.get("ack/3/1")
    genuine.set("ack/3/1", Ack(1, True).to_json())
    assert Ack.from_json(genuine.get("ack/3/1"), 1).ok


# ----- every message is checked before it is acted on ---------------------------------------------


@pytest.mark.parametrize("change", [
    {"op": "format-disk"}, {"seq": 8}, {"tokens": [[-1]]}, {"tokens": [[1, 2]]}, {"positions": [["0"]]},
    {"members": {"0": INCARNATION}}, {"members": {"1": "../../etc"}}, {"slot": True}, {"extra": 1}, {"start": -5},
    {"first_row": -1}, {"first_row": 5000}, {"op": "set_blocks", "blocks": [-1]}, {"op": "set_blocks", "blocks": "0"},
    {"op": "set_blocks", "blocks": [True]}, {"op": "move", "src": "1"}, {"op": "move", "dst": 1.5},
    {"op": "move", "length": -3}, {"op": "align", "rows": 0}, {"op": "align", "rows": 4097}, {"op": "resize"},
    {"publish": [0]}, {"publish": ["3"]}, {"publish": 3}, {"publish": [True]}, {"publish": list(range(1, 5000))},
    {"eager": "yes"}, {"greedy": 1},
])
def test_malformed_commands_are_rejected(change: dict[str, object]) -> None:
    raw = json.loads(Command(7, "run", {1: INCARNATION}, step_id=1, tokens=[[5]], positions=[[0]]).to_json())
    assert Command.from_json(json.dumps(raw), 7).op == "run"
    with pytest.raises(WorkerMessageRejected):
        Command.from_json(json.dumps(raw | change), 7)


def test_malformed_acks_assignments_and_tensors_are_rejected() -> None:
    with pytest.raises(WorkerMessageRejected, match="rank"):
        Ack.from_json(Ack(2, True).to_json(), 1)  # rank 2 answering in rank 1's place
    with pytest.raises(WorkerMessageRejected):
        Ack.from_json(json.dumps({"rank": 1, "ok": "yes"}))
    with pytest.raises(WorkerMessageRejected):
        Ack.from_json(json.dumps({"rank": 1, "ok": True, "stage_s": [float("nan")]}))  # NaN: not a time
    pairs = [[17.0, -0.25], [3.0, float("-inf")]]  # a greedy run's pairs, exactly as sent (float32 values)
    assert Ack.from_json(Ack(1, True, pairs=pairs).to_json()).pairs == pairs
    for bad in ([[1.5, 0.0]], [[-1.0, 0.0]], [["3", 0.0]], [[3.0]], [[3.0, "x"]], "pairs", [[3, 0.0]]):
        with pytest.raises(WorkerMessageRejected, match="pairs"):
            Ack.from_json(json.dumps({"rank": 1, "ok": True, "pairs": bad}))
    good = Assignment("m", "float32", 1, 8, (), 0, 0, 2, "gloo", -1, 1, 1, 2, 5.0)
    assert Assignment.from_json(good.to_json()) == good
    for change in ({"dtype": "int8"}, {"data_rank": 2}, {"next_rank": 7}, {"backend": "mpi"}, {"timeout_s": -1}):
        with pytest.raises(WorkerMessageRejected):
            Assignment.from_json(json.dumps(json.loads(good.to_json()) | change))
    blob = tensor_to_bytes(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(tensor_from_bytes(blob), torch.arange(6, dtype=torch.float32).reshape(2, 3))
    with pytest.raises(WorkerMessageRejected, match="bytes for shape"):
        tensor_from_bytes(blob[:-4])
    with pytest.raises(WorkerMessageRejected):
        tensor_from_bytes(b'{"shape": [-1], "dtype": "float32"}\n')
    with pytest.raises(WorkerMessageRejected):
        JoinReport.from_json(json.dumps({"rank": 0, "incarnation": INCARNATION, "pid": 1, "host": "h",
                                         "topology": {}}))


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


def test_local_workers_ignore_a_forged_stop(loaded: LoadedModel) -> None:
    pipeline = loaded.pipeline
    assert isinstance(pipeline, DistributedPipeline)
    expected = _greedy(pipeline)
    stranger = _stranger(pipeline.pool)
    seq = pipeline._seq  # the next command the workers wait for
    stranger.set(cmd_key(seq), Command(seq, "exit", pipeline.pool.incarnations()).to_json())
    time.sleep(0.5)  # a worker acting on it would exit now
    assert not any(pipeline.pool.exited(rank) for rank in pipeline.pool.procs)
    assert _greedy(pipeline) == expected
    seq = pipeline._seq
    forged = Command(seq, "set_blocks", pipeline.pool.incarnations(), slot=0, blocks=[], expected_acks=2)
    stranger.set(cmd_key(seq), forged.to_json())  # unsigned: would leave row 0 without its KV
    time.sleep(0.3)
    assert _greedy(pipeline) == expected  # ignored: the coordinator's own commands ran
    assert pipeline.health()["status"] == "ok"


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
    seq = pipeline._seq
    pipeline.reset(0)
    pipeline.reset(1)
    assert pipeline._seq == seq and len(pipeline._row_ops) == 2  # nothing sent yet
    pipeline._row_ops.append(Command(0, "reset", {}, slot=pipeline.rows))  # past the coordinator's check
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


def test_outputs_over_a_store_message_travel_in_signed_parts(pool: WorkerPool) -> None:
    """An exit's logits for many rows exceed a TCPStore message (8 MiB): the value goes in parts, each
    signed under its own key, joined and checked on reading; a forged part is refused; deleting the key
    deletes its parts."""
    from stagewise.runtime.sealed_store import PART_BYTES

    raw = _stranger(pool)
    worker = SealedStore(raw, pool.secret, pool.session, "worker 1")
    coordinator = SealedStore(raw, pool.secret, pool.session, "coordinator")
    logits = torch.randn(40, 128_256, dtype=torch.bfloat16)  # 10.3 MB
    with pytest.raises(Exception):  # noqa: B017  # one store message cannot hold it (the store drops that client)
        _stranger(pool).set("out/7/logits-whole", tensor_to_bytes(logits))
    worker.set(out_key(7, "logits"), tensor_to_bytes(logits))
    parts = -(-len(tensor_to_bytes(logits)) // PART_BYTES)
    assert parts == 3 and raw.check([f"out/7/logits#{i}" for i in range(parts)])
    assert torch.equal(coordinator.read(out_key(7, "logits"), tensor_from_bytes), logits)
    stolen = bytes(raw.get("out/7/logits#1"))
    raw.set("out/7/logits#1", stolen[:-1] + bytes([stolen[-1] ^ 1]))  # one bit of one part
    with pytest.raises(WorkerMessageRejected, match=r"logits#1.*bad signature"):
        coordinator.read(out_key(7, "logits"), tensor_from_bytes)
    raw.set("out/7/logits#1", raw.get("out/7/logits#0"))  # a part moved to another index
    with pytest.raises(WorkerMessageRejected, match="bad signature"):
        coordinator.read(out_key(7, "logits"), tensor_from_bytes)
    coordinator.delete_key(out_key(7, "logits"), parts=True)
    assert not raw.check([out_key(7, "logits")]) and not any(raw.check([f"out/7/logits#{i}"]) for i in range(parts))
    worker.set(out_key(8, "logits"), tensor_to_bytes(logits))  # never read: the parts are found and deleted
    coordinator.delete_key(out_key(8, "logits"), parts=True)
    assert not any(raw.check([f"out/8/logits#{i}"]) for i in range(parts))

