"""Load one stage's weights straight to its device: build on meta, stream, assign, verify.

Only the stage's own tensors are read. Missing, unexpected, duplicate or mis-shaped tensors and
parameters left on meta are errors (:class:`~stagewise.errors.WeightsError`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from stagewise.errors import WeightsError
from stagewise.models.stage_model import StageModel
from stagewise.weights.tensor_source import TensorSource, block_index, keeps_packed

Progress = Callable[[str, int], None]  # (tensor name, bytes loaded)


def stage_tensor_names(stage: StageModel, available: set[str]) -> set[str]:
    """Names in ``available`` that belong to ``stage`` (its blocks, entry and exit)."""
    wanted = set()
    for name in available:
        block = block_index(name)
        if block is not None:
            if stage.start <= block < stage.end:
                wanted.add(name)
        elif name.startswith("model.embed_tokens.") and stage.entry:
            wanted.add(name)
        elif (name.startswith("model.norm.") or name.startswith("lm_head.")) and stage.exit:
            wanted.add(name)
    return wanted


def _source_name(stage: StageModel, name: str, available: set[str]) -> str:
    if name == "lm_head.weight" and name not in available and stage.config.tie_word_embeddings:
        return "model.embed_tokens.weight"  # tied: the head reads the embedding
    return name


def load_stage(stage: StageModel, source: TensorSource, device: torch.device, dtype: torch.dtype,
               progress: Progress | None = None) -> None:
    """Fill ``stage`` (built on meta) with its tensors from ``source``, each placed on ``device``."""
    available = source.names()
    expected = dict(stage.named_parameters(remove_duplicate=False))
    tie_in_stage = stage.entry and stage.exit and stage.config.tie_word_embeddings
    if tie_in_stage:
        expected.pop("lm_head.weight", None)
    used: set[str] = set()
    modules = dict(stage.named_modules())
    for name in sorted(expected):
        src = _source_name(stage, name, available)
        if src not in available:
            raise WeightsError(f"{source.label}: missing tensor {src!r}")
        param = expected[name]
        want = tuple(param.shape)
        got = tuple(source.shape(src))
        if got != want:
            raise WeightsError(f"{source.label}: tensor {src!r} has shape {list(got)}, expected {list(want)}")
        owner_name, _, leaf = name.rpartition(".")
        owner = modules[owner_name]
        if keeps_packed(owner, source, src):
            qweight = source.load_quantized(src, device)
            owner.set_quantized_param(leaf, qweight, dtype)  # stays packed: no dequantized copy
            nbytes = qweight.nbytes
        else:
            # norms and other small tensors keep float32 where the model computes them in float32
            tensor = source.load(src, device, dtype)
            setattr(owner, leaf, nn.Parameter(tensor, requires_grad=False))
            nbytes = tensor.numel() * tensor.element_size()
        used.add(src)
        if progress is not None:
            progress(name, nbytes)
    if tie_in_stage:
        stage.tie_embeddings()
    unexpected = stage_tensor_names(stage, available) - used - _optional(stage, available)
    if unexpected:
        raise WeightsError(f"{source.label}: unexpected tensor {sorted(unexpected)[0]!r} for this model")
    stage.init_buffers(device)
    for name, buf in stage.named_buffers():
        if buf.is_meta:
            raise WeightsError(f"buffer {name!r} left on meta")
    for name, param in stage.named_parameters():
        if param.is_meta:
            raise WeightsError(f"parameter {name!r} left on meta")


def _optional(stage: StageModel, available: set[str]) -> set[str]:
    """Tensors a checkpoint may carry that we knowingly do not use."""
    names = {n for n in available if n.endswith("rotary_emb.inv_freq")}
    if stage.exit and stage.config.tie_word_embeddings and "lm_head.weight" in available:
        names.add("lm_head.weight")
    return names
