"""``--workers ray:N``: worker actors placed on a Ray instance (a local one, CPU only here) join the
same control plane as any worker; two stages through them equal one process, bit for bit; a lost
actor is placed again and rejoins; closing leaves no actor behind."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from stagewise.engine.model_loading import load_model
from stagewise.errors import ConfigError
from stagewise.runtime.remote_pipeline import DistributedPipeline
from stagewise.runtime.worker_mode import WorkerMode
from tests.hf_models import QWEN3_CONFIGS, make_hf_model
from tests.multiprocess_helpers import assert_same, greedy_tokens, step_trace
from tests.staged import load_pipeline

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'stagewise[ray]')")

CONTEXT = 64


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)  # a local instance: the "existing cluster"
    yield
    ray.shutdown()


def test_two_stages_on_ray_actors_equal_single_process(ray_instance: None, tmp_path: Path) -> None:
    make_hf_model("qwen3", QWEN3_CONFIGS["qwen3-gqa"], tmp_path, seed=11)  # 3 blocks
    single = load_pipeline(tmp_path, [], torch.float32, context=CONTEXT)
    reference, ref_tokens = step_trace(single), greedy_tokens(single, CONTEXT)
    loaded = load_model(str(tmp_path), workers="ray:2", devices="cpu:1x1GiB", placement="pipeline:2",
                        context=CONTEXT, dtype="float32", worker_timeout_s=30, join_timeout_s=120)
    try:
        pipeline = loaded.pipeline
        assert isinstance(pipeline, DistributedPipeline) and pipeline.pool.ray is not None
        health = pipeline.health()
        assert health["status"] == "ok" and [w["stages"] for w in health["workers"]] == [[0], [1]]
        assert loaded.topology is not None and [d.id for d in loaded.topology.devices] == ["cpu:0", "cpu:1"]
        assert_same(reference, step_trace(pipeline))
        assert greedy_tokens(pipeline, CONTEXT) == ref_tokens
        lost = pipeline.pool.ray.actors[2]
        assert ray.get([a.exit_code.remote() for a in pipeline.pool.ray.actors.values()]) == [None, None]  # serving
        ray.kill(lost, no_restart=True)  # its heartbeats stop: declared lost, placed again, it rejoins
        deadline = time.monotonic() + 120  # a bound only: the loop ends on the state it waits for
        while pipeline.faults.respawns == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pipeline.faults.respawns == 1 and pipeline.wait_ready(120), pipeline.health()
        assert pipeline.pool.ray.actors[2] is not lost
        assert_same(reference, step_trace(pipeline))
        actors = list(pipeline.pool.ray.actors.values())
    finally:
        loaded.close()
    assert pipeline.pool.ray.actors == {}
    for actor in actors:  # killed: no actor outlives the coordinator's pool
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.exit_code.remote())


def test_ray_without_a_count_needs_gpus(ray_instance: None) -> None:
    with pytest.raises(ConfigError, match=r"has none: give the number of workers \(ray:N\)"):
        load_model("random:tiny-qwen3", workers="ray", context=CONTEXT)


def test_ray_mode_is_parsed_and_checked() -> None:
    assert WorkerMode.parse("ray:2") == WorkerMode(False, 2, ray=True)
    assert WorkerMode.parse("ray:3@10.0.0.1:6379").ray_address == "10.0.0.1:6379"
    assert WorkerMode.parse("ray:2").spawned and not WorkerMode.parse("2@h:1").spawned
    assert WorkerMode.parse("ray") == WorkerMode(False, 0, ray=True)  # one per GPU of the cluster
    for bad in ("ray:", "ray:0", "ray:two"):
        with pytest.raises(ConfigError, match="ray:N"):
            WorkerMode.parse(bad)
