"""BlockSpec and EndSpec: the per-block and entry/exit costs the planner and runtime use.

Counts that depend on the profile are kept as per-token / per-sequence *values* (elements);
:mod:`state_bytes` and :mod:`workspace_bytes` turn them into bytes for a :class:`Profile`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from stagewise.errors import ConfigError

MIXERS = ("attention", "linear_attention")


def _check_counts(obj: object, where: str) -> None:
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if f.type in ("int",) and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"{where}: {f.name} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class BlockSpec:
    """Costs of one decoder block (global ``index``).

    ``weight_bytes``: resident in the stored format. ``read_bytes_per_token``: weight bytes one
    decoded token reads (MoE: router + shared expert + top-k of the routed experts).
    ``flops_per_token``: matmul FLOPs for one token, excluding attention over the context,
    which is ``attention_flops_per_position`` per attended position.
    ``kv_values_per_token``: key + value elements per sequence per position (activation dtype).
    ``conv_state_values`` (activation dtype) and ``recurrent_state_values`` (float32): fixed
    per-sequence state of a linear-attention block, before double buffering.
    Workspace per token of a step, by kernel path (:mod:`stagewise.spec.workspace_bytes`): on the torch
    path ``activation_values_per_token`` (activation dtype), ``f32_values_per_token`` (router logits) and
    ``score_values_per_position`` (fp32 attention scores per attended position: one per query head); on
    the Triton path the values live at the block's peak, ``step_values_per_token`` (activation dtype)
    and ``step_f32_values_per_token`` (float32: the chunked delta rule, routing), and per decoding row
    ``decode_partial_values`` (float32: decode attention's split partials,
    :func:`~stagewise.spec.decode_splits.decode_partial_values`); with CUDA graphs the mixer runs
    eagerly beside the graphs' pool, its own temporaries ``mix_values_per_token`` (activation dtype: the
    conv's output, the rotated queries). ``matrices``: the
    ``(out, in)`` shapes the block multiplies by (fused and apart), whose dense tiles a packed matmul
    dequantizes. ``kv_heads``: key/value heads (fp8 KV keeps a scale per position and head).
    ``kernels_per_token``: kernels one decode
    step of the block launches in stagewise (:mod:`stagewise.spec.kernel_counts`);
    ``routed_experts`` / ``experts_per_token``: the MoE's E and top-k (0 for a dense MLP).
    """

    index: int
    mixer: str
    moe: bool
    weight_bytes: int
    read_bytes_per_token: int
    flops_per_token: int
    kv_values_per_token: int = 0
    conv_state_values: int = 0
    recurrent_state_values: int = 0
    attention_flops_per_position: int = 0
    activation_values_per_token: int = 0
    f32_values_per_token: int = 0
    score_values_per_position: int = 0
    kernels_per_token: int = 0
    routed_experts: int = 0
    experts_per_token: int = 0
    step_values_per_token: int = 0
    step_f32_values_per_token: int = 0
    decode_partial_values: int = 0
    matrices: tuple[tuple[int, int], ...] = ()
    kv_heads: int = 0
    cut_values_per_token: int = 0  # what crosses a packed step's graph cuts: residual, mixer projections and output
    mix_values_per_token: int = 0  # the mixer's own temporaries, allocated eagerly beside the graphs' pool

    def __post_init__(self) -> None:
        if self.mixer not in MIXERS:
            raise ConfigError(f"block {self.index}: mixer {self.mixer!r} must be one of {MIXERS}")
        _check_counts(self, f"block {self.index}")
        if self.read_bytes_per_token > self.weight_bytes:
            raise ConfigError(f"block {self.index}: reads more bytes per token than it holds")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EndSpec:
    """Entry (token embedding) or exit (final norm + LM head) costs.

    ``shared_bytes`` (exit only): bytes of the exit that are the very tensor the entry holds
    (tied embeddings); a stage owning both entry and exit holds them once.
    ``logits_values_per_token`` (exit only): fp32 logits per token (the vocabulary).
    """

    weight_bytes: int
    read_bytes_per_token: int
    flops_per_token: int
    shared_bytes: int = 0
    logits_values_per_token: int = 0
    kernels_per_token: int = 0

    def __post_init__(self) -> None:
        _check_counts(self, "entry/exit")
        if self.shared_bytes > self.weight_bytes:
            raise ConfigError("exit: shared_bytes exceeds weight_bytes")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
