"""A worker that runs every stage keeps a greedy step's tokens: the next step over the same rows reads them
there (``Run.tokens_of``), sent before the coordinator collects the step it reads from. Batched greedy
decoding through it equals one process exactly, and a step whose source step fails or is rolled back is
rolled back too, the pipeline serving on bit-identical."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.model_loading import load_model
from stagewise.errors import StagewiseError, StepCancelled, StepFailed, WorkerMessageRejected
from stagewise.runtime.distributed_start import open_pool, start_workers
from stagewise.runtime.remote_pipeline import DistributedPipeline
from stagewise.runtime.worker import Worker
from stagewise.runtime.worker_messages import Exit, Run
from stagewise.runtime.worker_tokens import WorkerTokens
from stagewise.spec.model_config import ModelConfig
from tests.batch_runs import run_batch
from tests.hf_models import QWEN3_CONFIGS, make_hf_model
from tests.multiprocess_helpers import assert_same, batch_requests, step_trace
from tests.staged import load_pipeline, specs_for_cuts

CONTEXT = 192  # three KV blocks per row: sequences cross block boundaries
ROWS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3-tokens")
    make_hf_model("qwen3", QWEN3_CONFIGS["qwen3-gqa"], path, seed=11)
    return path


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> Iterator[DistributedPipeline]:
    """One local worker running the whole model (entry and exit in one process), every row its whole context."""
    config = ModelConfig.from_path(model_dir)
    pool = open_pool("local", timeout_s=20.0)
    pipe = start_workers(pool, config, str(model_dir), specs_for_cuts(config, []), torch.float32, CONTEXT,
                         join_timeout_s=60, batch=ROWS)
    pipe.run_ahead = True
    yield pipe
    pipe.close()


def _runs(pipeline: DistributedPipeline, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every run's fields as the coordinator sends them, from now on."""
    sent: list[dict[str, Any]] = []
    send = pipeline.commands.send

    def spy(kind: type, **fields: Any) -> int:
        if kind is Run:
            sent.append(fields)
        return send(kind, **fields)

    monkeypatch.setattr(pipeline.commands, "send", spy)
    return sent


def test_batched_greedy_decoding_reads_the_kept_tokens(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--workers local --max-seqs 4 --kv-tokens 256`` on one device: one worker runs the whole model."""
    args = dict(devices="cpu:2x1GiB", context=CONTEXT, dtype="float32", max_seqs=ROWS, prefill_chunk=16,
                kv_tokens=256, placement="single")  # 4 blocks of 64 positions for 4 rows of up to 3: preemption
    single = load_model(str(model_dir), **args)  # type: ignore[arg-type]
    single.pipeline.run_ahead = True  # type: ignore[attr-defined]  # the GPU's schedule, on the CPU
    vocab = single.config.vocab_size
    together = batch_requests(vocab, [5, 30, 11, 3, 20, 9], [6, 4, 8, 5, 3, 6])
    crowded = batch_requests(vocab, [40, 70, 10, 60], [30, 10, 60, 10], seed=1)
    try:
        want_together, _ = run_batch(Batcher(single.pipeline, CONTEXT, 16), together)
        reference = Batcher(single.pipeline, CONTEXT, 16)
        want_crowded, _ = run_batch(reference, crowded)
        assert reference.preemptions > 0
    finally:
        single.close()
    loaded = load_model(str(model_dir), workers="local", worker_timeout_s=20, **args)  # type: ignore[arg-type]
    try:
        pipeline = loaded.pipeline
        assert isinstance(pipeline, DistributedPipeline)
        assert pipeline.keeps_tokens and not pipeline.run_ahead and pipeline.max_in_flight == 1  # a CPU exit
        pipeline.run_ahead = True
        sent = _runs(pipeline, monkeypatch)
        batcher = Batcher(pipeline, CONTEXT, 16)
        got, errors = run_batch(batcher, together)
        assert errors == [None] * len(together) and got == want_together  # tokens and log-probabilities, exactly
        got, errors = run_batch(batcher, crowded)
        assert errors == [None] * len(crowded) and got == want_crowded
        assert batcher.preemptions == reference.preemptions
        chained = [r for r in sent if "tokens_of" in r]
        assert len(chained) > len(sent) // 2  # most decode steps read the previous step's tokens in the worker
        assert all(r["tokens_of"] < r["step_id"] for r in chained)
        assert pipeline.pool.plane.awaiting() == []  # every step settled
    finally:
        loaded.close()


def _greedy_step(pipeline: DistributedPipeline, tokens: torch.Tensor | WorkerTokens, pos: int, **kw: Any) -> Any:
    return pipeline._submit(tokens, torch.tensor([[pos]]), None, False, 0, kw.get("cancel"), False, True)


def test_a_step_reading_a_failed_steps_tokens_fails_too(model_dir: Path, pipeline: DistributedPipeline) -> None:
    reference = step_trace(load_pipeline(model_dir, [], torch.float32, context=CONTEXT))
    prompt = torch.tensor([[7, 1, 30, 2, 9]])
    pipeline.reset(0)
    pipeline.step(prompt, torch.arange(5)[None], start=0)
    # the worker refuses the first step (a position past the context): the second finds no tokens to read
    bad = _greedy_step(pipeline, torch.tensor([[3]]), CONTEXT + 5)
    assert isinstance(bad.tokens, WorkerTokens)
    with pytest.raises(ValueError, match="same rows"):  # another row than the step it reads ran
        pipeline.submit(bad.tokens, torch.tensor([[6]]), first_row=1, greedy=True)
    after = _greedy_step(pipeline, bad.tokens, 6)
    with pytest.raises(StagewiseError, match="outside the context"):
        bad.result()
    with pytest.raises(StepFailed, match=f"tokens of step {bad.step_id}"):
        after.result()
    # the first step runs, but the coordinator rolls it back (cancelled): the step that read it goes too
    gone: list[bool] = []
    cancelled = _greedy_step(pipeline, torch.tensor([[3]]), 5, cancel=lambda: bool(gone))
    reader = _greedy_step(pipeline, cancelled.tokens, 6)
    gone.append(True)  # its client leaves once both are sent
    with pytest.raises(StepCancelled):
        cancelled.result()
    with pytest.raises(StepFailed, match=f"step {cancelled.step_id}, whose tokens it read, was rolled back"):
        reader.result()
    assert not pipeline.degraded and pipeline.pool.plane.awaiting() == []
    assert_same(reference, step_trace(pipeline))


def test_only_a_worker_running_entry_and_exit_keeps_tokens(model_dir: Path) -> None:
    config = ModelConfig.from_path(model_dir)
    pool = open_pool("local", timeout_s=20.0)
    two = start_workers(pool, config, str(model_dir), specs_for_cuts(config, [1]), torch.float32, CONTEXT,
                        join_timeout_s=60, batch=ROWS)
    try:
        assert not two.keeps_tokens
        with pytest.raises(ValueError, match="keeps tokens"):
            two.run_ahead = True
        two.reset(0)
        handle = two.submit(torch.tensor([[3]]), torch.tensor([[0]]), start=0, greedy=True)
        assert handle.tokens is None
        handle.result()
        with pytest.raises(ValueError, match="keeps them"):
            two.submit(WorkerTokens(handle.step_id, 0, 1), torch.tensor([[1]]), greedy=True)
    finally:
        two.close()


class _Blocked(Exception):
    pass


class _Plane:
    """The worker's control plane, scripted: ``commands`` queued, acknowledgements recorded in ``log``."""

    rank, incarnation = 1, "a" * 32

    def __init__(self, commands: list[Any], log: list[str]) -> None:
        self.commands, self.log = commands, log

    def ready(self) -> bool:
        return bool(self.commands)

    def receive(self) -> Any:
        if not self.commands:
            raise _Blocked  # a real plane would wait here for the coordinator
        command = self.commands.pop(0)
        if isinstance(command, Exception):
            raise command
        return command

    def send(self, ack: Any) -> None:
        self.log.append(f"ack {ack.seq}")


class _Segment:
    """Runs nothing: each run's launch is logged and its logits make token ``step_id``."""

    def __init__(self, log: list[str]) -> None:
        self.log, self.kept = log, {}

    def publish(self, step_id: int) -> None:
        pass

    def run(self, cmd: Run) -> Any:
        self.log.append(f"launch {cmd.seq}")
        logits = torch.zeros(len(cmd.positions), 1, 50)
        logits[:, :, cmd.step_id] = 1.0
        return SimpleNamespace(output=SimpleNamespace(logits=logits, hidden=torch.empty(0)), stage_s=[0.0], handoff_s=0.0)

    def keep_tokens(self, step_id: int, tokens: torch.Tensor) -> None:
        self.kept[step_id] = tokens


@pytest.mark.parametrize("chained", [True, False])
def test_a_run_that_reads_the_kept_tokens_is_launched_before_the_last_is_acknowledged(chained: bool) -> None:
    log: list[str] = []
    members = {1: _Plane.incarnation}
    second = {"tokens_of": 1} if chained else {"tokens": [[4]]}
    commands = [Run(seq=1, members=members, step_id=1, tokens=[[3]], positions=[[0]], greedy=True),
                Run(seq=2, members=members, step_id=2, positions=[[1]], greedy=True, **second),
                Exit(seq=3, members=members)]
    worker = Worker(_Plane(commands, log), None, None)  # type: ignore[arg-type]
    worker.assignment, worker.segment = SimpleNamespace(first_seq=1), _Segment(log)  # type: ignore[assignment]
    assert worker.serve() == 0
    want = ["launch 1", "launch 2", "ack 1", "ack 2"] if chained else ["launch 1", "ack 1", "launch 2", "ack 2"]
    assert log == want
    assert [int(t) for t in worker.segment.kept[2].flatten()] == [2]  # type: ignore[union-attr]


def test_a_forged_message_does_not_hold_back_an_acknowledgement() -> None:
    """A held run's acknowledgement goes out before the worker waits for a genuine command after a forged one
    (the coordinator may send nothing more until it has it)."""
    log: list[str] = []
    members = {1: _Plane.incarnation}
    commands = [Run(seq=1, members=members, step_id=1, tokens=[[3]], positions=[[0]], greedy=True),
                WorkerMessageRejected("worker 1: a message failed its signature")]
    worker = Worker(_Plane(commands, log), None, None)  # type: ignore[arg-type]
    worker.assignment, worker.segment = SimpleNamespace(first_seq=1), _Segment(log)  # type: ignore[assignment]
    with pytest.raises(_Blocked):
        worker.serve()
    assert log == ["launch 1", "ack 1"]
