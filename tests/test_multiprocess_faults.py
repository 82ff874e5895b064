"""Worker faults: a killed or hung worker fails the request (every request of a batch) with WorkerLost
within the bound, the pipeline refuses requests while degraded and resumes, bit-identical, once the
worker rejoins."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.model_loading import load_model
from stagewise.errors import StagewiseError, WorkerLost, WorkerMessageRejected, WorkerNotJoined
from stagewise.runtime.builder import build_pipeline
from stagewise.runtime.distributed_start import open_pool, start_workers
from stagewise.runtime.greedy_pairs import greedy_pairs
from stagewise.runtime.remote_pipeline import DistributedPipeline
from stagewise.runtime.worker_secret import SECRET_ENV
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.safetensors_source import SafetensorsSource
from tests.batch_runs import Run, run_batch
from tests.hf_models import QWEN3_CONFIGS, make_hf_model
from tests.multiprocess_helpers import (
    StepTrace,
    assert_same,
    batch_requests,
    identity_blocks,
    step_trace,
)
from tests.staged import load_pipeline, specs_for_cuts

CONTEXT = 48
STEP_TIMEOUT_S = 8.0
HEARTBEAT_S = 2.0
BOUND_S = 10.0  # a fault must surface within this
ROWS = 4  # sequence slots of the workers' stages (the batch test runs three requests at once)
BATCH_LENGTHS, BATCH_BUDGETS = [5, 9, 3], [6, 6, 6]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3-faults")
    make_hf_model("qwen3", QWEN3_CONFIGS["qwen3-tied-odd"], path, seed=5)  # 2 blocks
    return path


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> StepTrace:
    return step_trace(load_pipeline(model_dir, [], torch.float32, context=CONTEXT))


@pytest.fixture(scope="module")
def batch_reference(model_dir: Path) -> Run:
    """The three requests run together on one device in this process."""
    single = load_model(str(model_dir), placement="single", context=CONTEXT, dtype="float32", max_seqs=ROWS)
    try:
        requests = batch_requests(single.config.vocab_size, BATCH_LENGTHS, BATCH_BUDGETS)
        out, _ = run_batch(Batcher(single.pipeline, CONTEXT, 8, micro_batches=2), requests)
        return out
    finally:
        single.close()


def _start(model_dir: Path, rejoin: bool = True) -> DistributedPipeline:
    config = ModelConfig.from_path(model_dir)
    pool = open_pool("local", timeout_s=STEP_TIMEOUT_S, heartbeat_timeout_s=HEARTBEAT_S)
    return start_workers(pool, config, str(model_dir), specs_for_cuts(config, [1]), torch.float32, CONTEXT,
                         join_timeout_s=60, rejoin=rejoin, batch=ROWS)


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> Iterator[DistributedPipeline]:
    pipe = _start(model_dir)
    yield pipe
    pipe.close()
    assert all(proc.poll() is not None for proc in pipe.pool.procs.values())


def _pid(pipeline: DistributedPipeline, rank: int) -> int:
    return next(w["pid"] for w in pipeline.health()["workers"] if w["rank"] == rank)


def _fault_then_recover(pipeline: DistributedPipeline, reference: StepTrace, rank: int, sig: int) -> None:
    pid = _pid(pipeline, rank)
    started = time.monotonic()
    with pytest.raises(WorkerLost, match=f"worker {rank} .*lost"):
        step_trace(pipeline, on_decode={2: lambda: os.kill(pid, sig)})
    assert time.monotonic() - started < BOUND_S
    health = pipeline.health()
    assert health["degraded"] or pipeline.wait_ready(0)  # it may already be back
    if health["degraded"]:
        with pytest.raises(WorkerLost):  # refused at once while degraded
            pipeline.reset(0)
    assert pipeline.wait_ready(60), pipeline.health()
    assert _pid(pipeline, rank) != pid  # a new process rejoined with the same rank
    assert_same(reference, step_trace(pipeline))


def test_killed_worker_fails_request_then_rejoins(pipeline: DistributedPipeline, reference: StepTrace) -> None:
    assert_same(reference, step_trace(pipeline))
    _fault_then_recover(pipeline, reference, 2, signal.SIGKILL)


def test_worker_killed_mid_batch_fails_every_request_then_rejoins(pipeline: DistributedPipeline,
                                                                  batch_reference: Run) -> None:
    """Three requests decoding together; worker 2 is killed: each fails with WorkerLost, and once the
    worker rejoined the same requests give the single-device batched run's tokens again."""
    requests = batch_requests(pipeline.stages[0].model.config.vocab_size, BATCH_LENGTHS, BATCH_BUDGETS)
    batcher = Batcher(pipeline, CONTEXT, 8)
    pid = _pid(pipeline, 2)

    def kill(request: int, tokens: int) -> None:
        if request == 0 and tokens == 3:  # every request is decoding by now
            os.kill(pid, signal.SIGKILL)

    started = time.monotonic()
    out, errors = run_batch(batcher, requests, on_token=kill)
    assert time.monotonic() - started < BOUND_S
    assert all(isinstance(e, WorkerLost) for e in errors), errors
    assert all(0 < len(got) < len(want) for got, want in zip(out, batch_reference, strict=True))
    assert pipeline.wait_ready(60), pipeline.health()
    assert _pid(pipeline, 2) != pid
    again, errors = run_batch(batcher, requests)
    assert errors == [None] * len(requests) and again == batch_reference  # tokens and log-probabilities
    identity_blocks(pipeline)  # the next tests step row 0 as after loading


def test_hung_worker_fails_request_then_rejoins(pipeline: DistributedPipeline, reference: StepTrace) -> None:
    _fault_then_recover(pipeline, reference, 1, signal.SIGSTOP)  # heartbeat stops; the coordinator kills it


def test_failure_inside_a_worker_rolls_back(pipeline: DistributedPipeline, reference: StepTrace) -> None:
    pipeline.reset(0)
    with pytest.raises(StagewiseError):  # positions past the context fail inside worker 1's stage
        pipeline.step(torch.tensor([[3]]), torch.tensor([[CONTEXT + 5]]), start=CONTEXT + 5)
    assert not pipeline.degraded
    assert_same(reference, step_trace(pipeline))


def test_a_failed_micro_batch_rolls_back_alone(pipeline: DistributedPipeline, model_dir: Path) -> None:
    """Two steps in flight over disjoint rows (the batcher's micro-batches); the later one is refused by
    the workers: it fails with its typed error when collected (first), the earlier one is published and
    its row decodes on bit-identical to one process."""
    config = ModelConfig.from_path(model_dir)
    single = build_pipeline(config, SafetensorsSource(model_dir), specs_for_cuts(config, []), torch.float32, ROWS,
                            CONTEXT)
    assert pipeline.max_in_flight == 2
    prompt = torch.tensor([[7, 1, 30, 2, 9]])
    for pipe in (single, pipeline):
        pipe.reset(0)
        pipe.reset(2)
    want = [single.step(prompt, torch.arange(5)[None], start=0, first_row=0).logits]
    first = pipeline.submit(prompt, torch.arange(5)[None], start=0, first_row=0)
    refused = pipeline.submit(torch.tensor([[3]]), torch.tensor([[CONTEXT + 5]]), start=CONTEXT + 5, first_row=2)
    with pytest.raises(WorkerMessageRejected, match="outside the context"):
        refused.result()
    got = [first.result().logits]
    token, pos = int(want[0][0, -1].argmax()), 5
    for _ in range(3):
        want.append(single.step(torch.tensor([[token]]), torch.tensor([[pos]]), start=pos).logits)
        got.append(pipeline.submit(torch.tensor([[token]]), torch.tensor([[pos]]), start=pos).result().logits)
        token, pos = int(want[-1][0, -1].argmax()), pos + 1
    assert all(w is not None and g is not None and torch.equal(w, g) for w, g in zip(want, got, strict=True))
    # greedy rows only: the exit worker sends each row's (token, log-probability), not the logits
    logits = single.step(torch.tensor([[token]]), torch.tensor([[pos]]), start=pos).logits
    out = pipeline.submit(torch.tensor([[token]]), torch.tensor([[pos]]), start=pos, greedy=True).result()
    assert logits is not None and out.logits is None and out.pairs is not None
    assert torch.equal(out.pairs, greedy_pairs(logits[:, -1])[1])
    assert not pipeline.degraded


def test_rejoin_disabled_refuses_with_a_clear_message(model_dir: Path) -> None:
    pipe = _start(model_dir, rejoin=False)
    try:
        os.kill(_pid(pipe, 2), signal.SIGKILL)
        with pytest.raises(WorkerLost):
            step_trace(pipe, decode_steps=1)
        with pytest.raises(WorkerLost, match="not waiting for it to rejoin"):
            pipe.reset(0)
        assert pipe.health()["status"] == "failed"
    finally:
        pipe.close()
    assert all(proc.poll() is not None for proc in pipe.pool.procs.values())


def test_health_reports_an_exited_worker_at_once(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a killed worker's process has exited, health says so before any step or watcher tick notices
    (the watcher is held blind here: the window between its ticks): /health and admission (the server
    refuses while health is not ok) read the same state."""
    from stagewise.server.engine_front import LocalEngine
    from stagewise.server.serve_settings import ServeSettings
    from stagewise.server.server_state import ServerState

    pipe = _start(model_dir, rejoin=False)
    try:
        assert pipe.health()["status"] == "ok"
        monkeypatch.setattr(pipe.pool, "dead", lambda: {})  # the watcher has not looked yet
        proc = pipe.pool.procs[2]
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)  # the event itself: the process is gone
        report = pipe.health()
        assert report["status"] != "ok" and not next(w for w in report["workers"] if w["rank"] == 2)["alive"]
        state = ServerState(ServeSettings())
        state.model = object()  # type: ignore[assignment]
        state.engine = LocalEngine(type("Model", (), {"pipeline": pipe})(), object())  # type: ignore[arg-type]
        state.phase = "ready"
        with pytest.raises(WorkerLost):
            state.serving()
    finally:
        pipe.close()


def test_worker_that_never_joins(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers expected, one comes: a clear error in time, and the one that came goes home."""
    monkeypatch.setenv(SECRET_ENV, "a-secret-shared-by-the-coordinator-and-its-workers")
    with socket.socket() as probe:  # a free port for the coordinator load_model starts below
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = subprocess.Popen([sys.executable, "-m", "stagewise", "worker", "--join", f"127.0.0.1:{port}",
                               "--rank", "1", "--devices", "cpu:1x1GiB", "--timeout", "20"],
                              stderr=subprocess.PIPE, text=True)
    try:
        started = time.monotonic()
        with pytest.raises(WorkerNotJoined, match=r"rank\(s\) \[2\] did not join .* --rank 2"):
            load_model(str(model_dir), workers=f"2@127.0.0.1:{port}", join_timeout_s=6, context=CONTEXT)
        assert time.monotonic() - started < 6 + 12  # the 6 s join timeout, not the worker's 20 s (load may slow it)
        code = worker.wait(timeout=20)
        assert worker.stderr is not None
        err = worker.stderr.read()
        assert code == 2 and "not used" in err, err  # refused: it exits instead of lingering
    finally:
        if worker.poll() is None:
            worker.kill()


def test_a_worker_leaves_when_its_coordinator_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator disappears without telling its worker (no exit command): the worker's heartbeat
    connection drops and it exits with code 4 instead of lingering."""
    monkeypatch.setenv(SECRET_ENV, "a-secret-shared-by-the-coordinator-and-its-workers")
    pool = open_pool("1@127.0.0.1:0", timeout_s=20)
    worker = subprocess.Popen([sys.executable, "-m", "stagewise", "worker", "--join", pool.address, "--rank", "1",
                               "--devices", "cpu:1x1GiB", "--timeout", "20"], stderr=subprocess.PIPE, text=True)
    try:
        assert pool.wait_joins([1], 60)[1].pid == worker.pid
        pool.close(grace_s=0)  # the plane and the store go away; nothing was said
        assert worker.wait(timeout=30) == 4
    finally:
        if worker.poll() is None:
            worker.kill()
