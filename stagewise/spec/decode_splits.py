"""Decode splits: how many key ranges decode attention cuts each (sequence, KV head) into.

The count is a constant of the model (its KV heads), never of the step: each sequence's split ranges
are then a function of its own length only, so a sequence's attention output is the same bits whatever
other sequences share its batch and however long they are, and one CUDA graph serves every attended
length (:mod:`stagewise.kernels.decode_attention_triton`). The planner charges the partials from the
same numbers (:mod:`stagewise.spec.workspace_bytes`).

Choice (not measured yet: ``bench/results/warm_up_h200/README.md`` has the A/B): a split is at least one
key tile (``KV_BLOCK_TOKENS``), so a sequence of ``n`` positions keeps ``min(splits, ceil(n / 64))``
programs per KV head busy; at short context that is as many as the keys allow whatever the count, and
the count only matters once a sequence is long, where too few programs leave the SMs waiting on HBM.
A batch of one sequence launches ``kv_heads x splits`` programs: :data:`PROGRAMS_PER_SEQUENCE` (128)
is about one per SM of an H100 or H200 (132), reached with 16 splits at 8 KV heads (Llama-3 8B/70B, as
the slicing before this measured 16), 64 at 2 (Qwen3.6). At least :data:`MIN_SPLITS`, so that up to
``16 x 64`` = 1,024 keys each split is one tile; at most :data:`MAX_SPLITS`, so that the combine's merge
and the partials stay small (``heads x splits x (head_dim + 2)`` float32 values a decoding row).
"""

from __future__ import annotations

PROGRAMS_PER_SEQUENCE = 128  # ~ the SMs of an H100 / H200 (132): one wave from a single long sequence
MIN_SPLITS = 16
MAX_SPLITS = 64
PARTIAL_EXTRA_VALUES = 2  # a split's running max and sum, beside its head_dim weighted values


def decode_splits(kv_heads: int) -> int:
    """Key ranges per (sequence, KV head) of a model with ``kv_heads`` KV heads: a power of two in
    ``MIN_SPLITS .. MAX_SPLITS``, about :data:`PROGRAMS_PER_SEQUENCE` ``/ kv_heads`` (module note)."""
    if kv_heads < 1:
        raise ValueError(f"decode_splits needs at least one KV head, got {kv_heads}")
    splits = MIN_SPLITS
    while splits * kv_heads < PROGRAMS_PER_SEQUENCE and splits < MAX_SPLITS:
        splits *= 2
    return splits


def decode_partial_values(heads: int, kv_heads: int, head_dim: int) -> int:
    """Float32 values decode attention's partials hold per decoding row: each query head's splits, each a
    running max, a sum and ``head_dim`` weighted values."""
    return heads * decode_splits(kv_heads) * (head_dim + PARTIAL_EXTRA_VALUES)
