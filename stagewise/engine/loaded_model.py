"""LoadedModel: everything the engine needs to serve one model.

:func:`stagewise.engine.model_loading.load_model` is the one path from a user's MODEL argument to a running pipeline: open the
weights, plan (once) a certified placement on the devices, load each stage straight to its device,
and attach the tokenizer and chat template. CLI ``run``/``chat``/``bench`` and ``serve`` all use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from stagewise.engine.chat_template import ChatTemplate
from stagewise.engine.tokenizer import Tokenizer
from stagewise.hardware.topology import Topology
from stagewise.runtime.executor import Executor
from stagewise.runtime.peak_memory import PeakMemory
from stagewise.runtime.stage import ChargeCheck
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile


@dataclass
class LoadedModel:
    """A model ready to run: its pipeline, tokenizer, template, the placement it runs under and the one
    :class:`Profile` it was certified for (context, sequences, prefill chunk, KV dtype), which every
    consumer (engine, batcher, generator, warm-up, bench, status) reads."""

    name: str
    config: ModelConfig
    pipeline: Executor
    placement_json: dict[str, Any]  # the planner's JSON form of the placement used
    placement_summary: str  # e.g. "Fits across 2 devices: cpu:0 embedding + blocks 0-1 (...) · ..."
    tokenizer: Tokenizer | None
    chat_template: ChatTemplate
    profile: Profile  # decided once (placement/profile_fit.py), certified with the placement
    dtype: torch.dtype
    spec: ModelSpec | None = None  # the accounting the placement was certified with
    topology: Topology | None = None  # the devices it was planned on
    choice: str = ""  # what was chosen: "32,768 positions, 1 sequence, prefill chunks of 512: …"
    peaks: dict[str, PeakMemory] = field(default_factory=dict)  # by torch device: the load check's peak readings

    @property
    def max_context(self) -> int:
        """Positions per sequence: the profile's context."""
        return self.profile.context_tokens

    @property
    def prefill_chunk(self) -> int:
        """Tokens per prefill step: the profile's chunk."""
        return self.profile.prefill_chunk_tokens

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """Ids that end a text generation: the tokenizer's end tokens and the config's ``eos_token_id``."""
        eos = self.tokenizer.eos_token_ids if self.tokenizer is not None else frozenset()
        return frozenset(eos) | frozenset(self.config.eos_token_ids)

    def charge_checks(self) -> list[ChargeCheck]:
        """Planned vs measured per stage; the workspace and peak from :attr:`peaks` where a stage is its
        device's only one."""
        stages = self.pipeline.stages
        devices = [stage.spec.torch_device for stage in stages]
        return [stage.charge_check(self.peaks.get(d) if devices.count(d) == 1 else None)
                for stage, d in zip(stages, devices, strict=True)]

    def close(self) -> None:
        self.pipeline.close()
