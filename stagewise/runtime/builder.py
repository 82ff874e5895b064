"""Build a :class:`Pipeline` from stage specs: load each stage straight to its device."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

from stagewise.errors import PlacementError
from stagewise.runtime.channel import channel_for
from stagewise.runtime.pipeline import Pipeline
from stagewise.runtime.stage import Stage, StageSpec
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.tensor_source import TensorSource

StageProgress = Callable[[int, str, int], None]  # (stage index, tensor name, bytes)


def build_pipeline(config: ModelConfig, source: TensorSource, specs: Sequence[StageSpec], dtype: torch.dtype,
                   batch: int, max_context: int, link_kinds: Sequence[str | None] = (),
                   progress: StageProgress | None = None, timing: bool = False,
                   kv_blocks: int | None = None, snapshots: int = 0) -> Pipeline:
    """Load every stage (in order) and join them with channels chosen from ``link_kinds``; every stage
    holds a KV pool of ``kv_blocks`` blocks (default: ``batch`` whole contexts) and, where it keeps
    recurrent state, ``snapshots`` prefix-snapshot entries."""
    if not specs:
        raise PlacementError("a placement needs at least one stage")
    expected = 0
    for spec in specs:
        if spec.start != expected:
            raise PlacementError(f"stage {spec.index} starts at block {spec.start}, expected {expected}")
        expected = spec.end
    if expected != config.num_layers or not specs[0].entry or not specs[-1].exit:
        raise PlacementError("stages must cover every block, with the entry first and the exit last")
    stages: list[Stage] = []
    try:
        for spec in specs:
            cb = (lambda name, n, k=spec.index: progress(k, name, n)) if progress else None
            stage = Stage.load(spec, config, source, dtype, cb)
            stage.allocate_state(batch, max_context, kv_blocks, snapshots)
            stages.append(stage)
    except BaseException:
        for stage in stages:
            stage.close()
        raise
    kinds = list(link_kinds) or [None] * (len(stages) - 1)
    channels = [channel_for(a.device, b.device, kinds[i]) for i, (a, b) in enumerate(itertools.pairwise(stages))]
    return Pipeline(stages, channels, timing=timing)
