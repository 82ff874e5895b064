"""Stages in separate worker processes (Gloo on 127.0.0.1) give bit-identical results, one sequence at a
time and many at once (continuous batching over the workers' rows and KV pool, preemption included)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.model_loading import load_model
from stagewise.hardware import defaults
from stagewise.runtime.distributed_start import open_pool, start_workers
from stagewise.runtime.remote_pipeline import DistributedPipeline
from stagewise.runtime.worker_secret import SECRET_ENV
from stagewise.spec.model_config import ModelConfig
from tests.batch_runs import run_batch
from tests.hf_hybrid_models import make_hf_hybrid_model
from tests.hf_models import QWEN3_CONFIGS, make_hf_model
from tests.multiprocess_helpers import assert_same, batch_requests, greedy_tokens, step_trace
from tests.staged import load_pipeline, specs_for_cuts

CONTEXT = 64
BATCH_CONTEXT = 192  # three KV blocks per row: sequences cross block boundaries


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3-mp")
    make_hf_model("qwen3", QWEN3_CONFIGS["qwen3-gqa"], path, seed=11)  # 3 blocks
    return path


def test_two_local_workers_through_load_model(model_dir: Path) -> None:
    """``load_model(..., workers="local")``: same placement, same logits, same tokens."""
    args = dict(devices="cpu:2x1GiB", placement="pipeline:2", context=CONTEXT, dtype="float32")
    single = load_model(str(model_dir), **{**args, "placement": "single"})  # type: ignore[arg-type]
    reference = step_trace(single.pipeline)
    ref_tokens = greedy_tokens(single.pipeline, CONTEXT)
    single.close()
    loaded = load_model(str(model_dir), workers="local", worker_timeout_s=20, **args)  # type: ignore[arg-type]
    try:
        pipeline = loaded.pipeline
        assert isinstance(pipeline, DistributedPipeline)
        health = pipeline.health()
        assert health["status"] == "ok" and not health["degraded"] and health["backend"] == "gloo"
        assert [w["stages"] for w in health["workers"]] == [[0], [1]]
        assert all(c.measured_bytes > 0 for c in loaded.charge_checks())
        # the coordinator knows each worker's state (on the meta device), as the state metrics read it
        assert all(stage.ledger.charged.get("state", 0) > 0 and stage.states for stage in pipeline.stages)
        assert_same(reference, step_trace(pipeline))
        assert greedy_tokens(pipeline, CONTEXT) == ref_tokens
        assert len(pipeline.last_timings.stage_s) == 2 and len(pipeline.last_timings.handoff_s) == 1
    finally:
        loaded.close()
    assert pipeline.health()["status"] == "closed"
    assert all(proc.poll() is not None for proc in pipeline.pool.procs.values())  # no orphans


def test_batched_requests_through_workers_equal_single_device(model_dir: Path) -> None:
    """``--workers local --max-seqs 4 --kv-tokens 256``: requests run together through the workers (two
    micro-batches in flight, one per worker) give each request the tokens and log-probabilities of
    the same batched run on one device in this process, exactly; with the pool too small for all of
    them, sequences are preempted the same way."""
    args = dict(devices="cpu:2x1GiB", context=BATCH_CONTEXT, dtype="float32", max_seqs=4, prefill_chunk=16,
                kv_tokens=256)  # 4 blocks of 64 positions for 4 rows of up to 3 blocks
    single = load_model(str(model_dir), placement="single", **args)  # type: ignore[arg-type]
    roomy = load_model(str(model_dir), placement="single", **{**args, "kv_tokens": None})  # type: ignore[arg-type]
    vocab = single.config.vocab_size
    together = batch_requests(vocab, [5, 30, 11, 3, 20, 9], [6, 4, 8, 5, 3, 6])  # 6 requests, 4 rows, 1 block each
    crowded = batch_requests(vocab, [40, 70, 10, 60], [30, 10, 60, 10], seed=1)  # crossing blocks: preemption
    # the workers' schedule: two micro-batches, prompts in packed steps (their layouts travel with the runs)
    try:
        reference = Batcher(single.pipeline, BATCH_CONTEXT, 16, micro_batches=2)
        want_together, _ = run_batch(reference, together)
        want_crowded, _ = run_batch(reference, crowded)
        assert reference.preemptions > 0
        unpreempted, _ = run_batch(Batcher(roomy.pipeline, BATCH_CONTEXT, 16, micro_batches=2), crowded)
        assert [[t for t, _ in r] for r in want_crowded] == [[t for t, _ in r] for r in unpreempted]
    finally:
        single.close()
        roomy.close()
    loaded = load_model(str(model_dir), workers="local", placement="pipeline:2", worker_timeout_s=20,
                        **args)  # type: ignore[arg-type]
    try:
        pipeline = loaded.pipeline
        assert isinstance(pipeline, DistributedPipeline)
        assert pipeline.rows == 4 and pipeline.kv_pool.blocks == 4 and pipeline.max_in_flight == 2
        batcher = Batcher(pipeline, BATCH_CONTEXT, 16)
        assert batcher.micro_batches == 2  # one micro-batch per worker in flight
        got, errors = run_batch(batcher, together)
        assert errors == [None] * len(together)
        assert got == want_together  # tokens and log-probabilities, exactly
        got, errors = run_batch(batcher, crowded)
        assert errors == [None] * len(crowded)
        assert got == want_crowded and batcher.preemptions == reference.preemptions
        # every step settled: the plane awaits no acknowledgement (nothing kept per command)
        assert pipeline.commands.seq > 10 and pipeline.pool.plane.awaiting() == []
    finally:
        loaded.close()


def test_hybrid_model_micro_batches_through_workers_equal_single_device(tmp_path: Path) -> None:
    """Gated-DeltaNet layers (recurrent state in entry pools, packed steps) through two workers with two micro-batches
    in flight, each published apart: every request's tokens and log-probabilities equal the same
    schedule on one device in this process."""
    make_hf_hybrid_model("qwen3_5-default-pattern", tmp_path, seed=7)
    args = dict(devices="cpu:2x1GiB", context=BATCH_CONTEXT, dtype="float32", max_seqs=4, prefill_chunk=16)
    single = load_model(str(tmp_path), placement="single", **args)  # type: ignore[arg-type]
    requests = batch_requests(single.config.vocab_size, [7, 19, 4, 12, 9], [9, 5, 8, 6, 7], seed=3)
    try:
        want, _ = run_batch(Batcher(single.pipeline, BATCH_CONTEXT, 16, micro_batches=2), requests)
    finally:
        single.close()
    loaded = load_model(str(tmp_path), workers="local", placement="pipeline:2", worker_timeout_s=20,
                        **args)  # type: ignore[arg-type]
    try:
        batcher = Batcher(loaded.pipeline, BATCH_CONTEXT, 16)
        assert batcher.micro_batches == 2
        got, errors = run_batch(batcher, requests)
        assert errors == [None] * len(requests)
        assert got == want
    finally:
        loaded.close()


def test_three_workers_equal_single_process(model_dir: Path) -> None:
    config = ModelConfig.from_path(model_dir)
    single = load_pipeline(model_dir, [], torch.float32, context=CONTEXT)
    staged = load_pipeline(model_dir, [1, 2], torch.float32, context=CONTEXT)
    reference = step_trace(single)
    assert_same(reference, step_trace(staged))
    pool = open_pool("local", timeout_s=20)
    pipeline = start_workers(pool, config, str(model_dir), specs_for_cuts(config, [1, 2]), torch.float32, CONTEXT,
                             join_timeout_s=60)
    try:
        assert len(pipeline.health()["workers"]) == 3
        assert_same(reference, step_trace(pipeline))
        assert_same(reference, step_trace(pipeline))  # reset between sequences works across processes
    finally:
        pipeline.close()


def test_workers_that_join_from_two_hosts(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``N@HOST:PORT``: workers join with ``stagewise worker``; the plan spans their hosts."""
    monkeypatch.setenv(SECRET_ENV, "a-secret-shared-by-the-coordinator-and-its-workers")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workers = [subprocess.Popen([sys.executable, "-m", "stagewise", "worker", "--join", f"127.0.0.1:{port}",
                                 "--rank", str(rank), "--devices", "cpu:1x1GiB", "--host-name", f"host{rank}"])
               for rank in (1, 2)]
    try:
        loaded = load_model(str(model_dir), workers=f"2@127.0.0.1:{port}", placement="pipeline:2", context=CONTEXT,
                            dtype="float32", join_timeout_s=60)
        try:
            assert loaded.topology is not None
            assert [d.host for d in loaded.topology.devices] == ["host1", "host2"]
            link = loaded.topology.link("cpu:0", "cpu:1")  # timed by the workers when they joined
            assert link.kind == "network" and link.measured
            assert (link.bandwidth_bytes_per_s, link.latency_s) != (defaults.NETWORK_BANDWIDTH_BYTES_PER_S,
                                                                    defaults.NETWORK_LATENCY_S)
            handoff_bytes = loaded.config.hidden_size * 4  # one float32 hidden state per decode token
            assert loaded.placement_json["predicted"]["handoff_s_per_token"] == pytest.approx(
                link.transfer_s(handoff_bytes), abs=1e-12)  # the plan priced the hop with the measured link
            assert [w["host"] for w in loaded.pipeline.health()["workers"]] == ["host1", "host2"]
            single = load_pipeline(model_dir, [], torch.float32, context=CONTEXT)
            assert_same(step_trace(single), step_trace(loaded.pipeline))
        finally:
            loaded.close()
        assert [w.wait(timeout=20) for w in workers] == [0, 0]  # told to exit, they leave
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
