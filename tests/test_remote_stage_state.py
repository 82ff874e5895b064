"""A worker's stage as the coordinator sees it: its state described on the meta device, with the shapes,
bytes and ledger charge of the state the worker allocates, so the state metrics read it as a local stage."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from stagewise.engine.metrics import EngineMetrics
from stagewise.runtime.remote_stage import RemoteStage
from stagewise.runtime.stage import Stage
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.safetensors_source import SafetensorsSource
from tests.hf_hybrid_models import make_hf_hybrid_model
from tests.staged import specs_for_cuts
from tests.test_server_support import make_model_dir

ROWS, CONTEXT, BLOCKS = 4, 128, 6


def _model(kind: str, tmp_path: Path) -> Path:
    if kind == "llama":
        return make_model_dir(tmp_path)
    make_hf_hybrid_model("qwen3_5-default-pattern", tmp_path)  # linear attention: recurrent rows too
    return tmp_path


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_remote_stage_describes_the_workers_state(kind: str, tmp_path: Path) -> None:
    path = _model(kind, tmp_path)
    config = ModelConfig.from_path(path)
    spec = specs_for_cuts(config, [1])[1]
    local = Stage.load(spec, config, SafetensorsSource(path), torch.float32)
    local.allocate_state(ROWS, CONTEXT, kv_blocks=BLOCKS)
    remote = RemoteStage(spec, config, torch.float32, rank=2)
    remote.describe_state(ROWS, CONTEXT, kv_blocks=BLOCKS)

    assert remote.states.keys() == local.states.keys()
    for k, state in local.states.items():
        assert type(remote.states[k]) is type(state) and remote.states[k].nbytes == state.nbytes
    assert all(t.device.type == "meta" for s in remote.states.values() for t in vars(s).values()
               if isinstance(t, torch.Tensor))  # no memory on the coordinator
    assert remote.ledger.charged["state"] == local.ledger.charged["state"] > 0
    assert remote.block_table is not None and local.block_table is not None
    assert remote.block_table.pool_blocks == local.block_table.pool_blocks  # the blocks and the scratch block
    assert remote.enable_graphs() is False  # the worker captures its own
    with pytest.raises(RuntimeError, match="lives in worker 2"):
        remote.allocate_state(ROWS, CONTEXT)

    in_use = []
    for stage in (local, remote):
        metrics = EngineMetrics()
        metrics.observe_rows(SimpleNamespace(rows=ROWS, stages=[stage]), 2, kv_blocks=3)  # type: ignore[arg-type]
        in_use.append(metrics.stage_state_in_use.labels("0", spec.device)._value.get())
    assert in_use[0] == in_use[1] > 0


def test_coordinator_never_touches_a_workers_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A coordinator whose stages sit in workers on two GPUs is no in-process ``Pipeline``: building it
    enables no peer access and initializes no CUDA context, even where CUDA is available; its KV pool
    and rows are the workers'."""
    from dataclasses import replace

    import stagewise.kernels.peer_copy_triton as peer_copy
    from stagewise.runtime.pipeline import Pipeline
    from stagewise.runtime.remote_pipeline import DistributedPipeline

    config = ModelConfig.from_path(make_model_dir(tmp_path))
    specs = [replace(s, device=f"cuda:{s.index}", torch_device=f"cuda:{s.index}") for s in specs_for_cuts(config, [1])]
    touched: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(peer_copy, "enable_peer_access", lambda *a: touched.append(a) or True)
    pipeline = DistributedPipeline(SimpleNamespace(), config, "m", specs, [1, 2], torch.float32,  # type: ignore[arg-type]
                                   batch=ROWS, context=CONTEXT, kv_blocks=BLOCKS)
    assert not isinstance(pipeline, Pipeline)
    assert touched == [] and not torch.cuda.is_initialized()
    assert pipeline.rows == ROWS and pipeline.kv_pool.blocks == BLOCKS
    assert all(t.device.type == "meta" for s in pipeline.stages for st in s.states.values()
               for t in vars(st).values() if isinstance(t, torch.Tensor))
