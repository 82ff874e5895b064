"""Profile: what a charge is computed for (context, batch, prefill chunk, activation dtype)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from stagewise.errors import ConfigError
from stagewise.spec.formats import activation_bytes
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS, KV_DTYPES, blocks_for, default_pool_blocks, kv_element_bytes

DEFAULT_CONTEXT_TOKENS = 4096  # assess / plan default; run may ask for more
DEFAULT_PREFILL_CHUNK_TOKENS = 512
MAX_CONTEXT_TOKENS = 1 << 24
MAX_KV_TOKENS = 1 << 36
# Kernel paths a stage's steps take (spec/workspace_bytes.py charges each): ``torch`` (CPU: the layers'
# torch reference ops), ``triton`` (accelerators: fused Triton kernels, cuBLAS, CUDA graphs), ``mixed``
# (a topology with both: the larger of the two)
KERNEL_PATHS = ("torch", "triton", "mixed")


@dataclass(frozen=True)
class Profile:
    """Serving profile: ``batch`` sequences of up to ``context_tokens`` positions each, prompts
    ingested ``prefill_chunk_tokens`` at a time, activations and conv state in ``activation_dtype``,
    keys and values in ``kv_dtype`` (None: the activation dtype; ``fp8``: float8 e4m3 with scales);
    steps take ``kernel_path`` (:data:`KERNEL_PATHS`), replayed as CUDA graphs where ``cuda_graphs``.
    ``kv_tokens``: the KV pool's size in positions, shared by all sequences (rounded up to whole
    blocks); None gives every sequence its whole context (``batch × context``, rounded up per sequence).
    ``prefix_snapshots``: entries of recurrent state kept for the prefix cache (a snapshot of a
    linear-attention block's state at a block boundary; charged only where a block keeps such state)."""

    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    batch: int = 1
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS
    activation_dtype: str = "bf16"
    kernel_path: str = "torch"
    kv_tokens: int | None = None
    prefix_snapshots: int = 0
    kv_dtype: str | None = None  # normalized: the activation dtype when not given
    cuda_graphs: bool = True  # with the triton path: decode steps replay graphs, packed steps graph pieces

    def __post_init__(self) -> None:
        if self.kv_dtype is None:
            object.__setattr__(self, "kv_dtype", {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(
                self.activation_dtype, self.activation_dtype))
        if self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"profile: kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        for name, top in (("context_tokens", MAX_CONTEXT_TOKENS), ("batch", 4096), ("prefill_chunk_tokens", 1 << 20)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ConfigError(f"profile: {name} must be an integer in 1..{top}, got {value!r}")
        activation_bytes(self.activation_dtype)
        if self.kv_tokens is not None and (isinstance(self.kv_tokens, bool) or not isinstance(self.kv_tokens, int)
                                           or not 1 <= self.kv_tokens <= MAX_KV_TOKENS):
            raise ConfigError(f"profile: kv_tokens must be an integer in 1..{MAX_KV_TOKENS}, got {self.kv_tokens!r}")
        if isinstance(self.prefix_snapshots, bool) or not isinstance(self.prefix_snapshots, int) \
                or not 0 <= self.prefix_snapshots <= 1 << 16:
            raise ConfigError(f"profile: prefix_snapshots must be an integer in 0..{1 << 16}, got {self.prefix_snapshots!r}")
        if self.kernel_path not in KERNEL_PATHS:
            raise ConfigError(f"profile: kernel_path must be one of {', '.join(KERNEL_PATHS)}, got {self.kernel_path!r}")

    @property
    def chunk_tokens(self) -> int:
        """Tokens per prefill step: the chunk, never more than the context."""
        return min(self.prefill_chunk_tokens, self.context_tokens)

    @property
    def step_tokens(self) -> int:
        """Tokens one step carries at most: a packed step's prompt chunks within the prefill budget (several
        prompts may share it), or all sequences but one decoding beside the last one's chunk of a KV block
        (the batcher always advances a prompt by a block, :func:`~stagewise.engine.step_plan.plan_packed_step`);
        never more than every sequence's whole context."""
        align = KV_BLOCK_TOKENS if self.prefill_chunk_tokens >= KV_BLOCK_TOKENS else 1
        return min(max(self.prefill_chunk_tokens, self.batch - 1 + align), self.batch * self.context_tokens)

    @property
    def kv_pool_blocks(self) -> int:
        """Usable KV blocks of ``KV_BLOCK_TOKENS`` positions in every stage's pool."""
        if self.kv_tokens is None:
            return default_pool_blocks(self.batch, self.context_tokens)
        return blocks_for(self.kv_tokens)

    @property
    def kv_pool_tokens(self) -> int:
        return self.kv_pool_blocks * KV_BLOCK_TOKENS

    @property
    def activation_bytes(self) -> int:
        return activation_bytes(self.activation_dtype)

    @property
    def kv_storage(self) -> str:
        """The KV cache's storage dtype (``kv_dtype``, normalized)."""
        assert self.kv_dtype is not None
        return self.kv_dtype

    @property
    def kv_element_bytes(self) -> int:
        return kv_element_bytes(self.kv_storage)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_activation_dtype(kinds: set[str]) -> str:
    """What stagewise runs in when not told: ``f32`` on CPU-only devices, ``bf16`` elsewhere."""
    return "f32" if not kinds - {"cpu"} else "bf16"


def kernel_path_for(kinds: set[str]) -> str:
    """The kernel path of devices of these kinds: ``triton`` on accelerators, ``torch`` on CPUs, ``mixed``."""
    accelerators = bool(kinds - {"cpu"})
    return ("mixed" if "cpu" in kinds else "triton") if accelerators else "torch"
