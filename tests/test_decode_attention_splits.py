"""Decode attention split by each sequence's own length, run by Triton's interpreter on CPU: it matches
attention over the row's keys (lengths on and off block boundaries, ranges of several tiles, more used
ranges than the combine merges at once, GQA, the output gate), and a row's output is the same bits
whatever rows share its batch and whatever attended length the step is run at: the property that lets
one CUDA graph per shape serve every length (:mod:`stagewise.runtime.step_graphs`)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from stagewise.engine.model_loading import load_model
from stagewise.kernels.decode_attention_triton import MERGE_SPLITS, decode_attention
from stagewise.kernels.triton_launch import kernels_on_host
from stagewise.models.kv_cache import KVCache
from stagewise.spec.decode_splits import MAX_SPLITS, MIN_SPLITS, decode_partial_values, decode_splits
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {"atol": 2e-6, "rtol": 2e-6}


def _pool(batch: int, kv_heads: int, block_tokens: int, dim: int, longest: int,
          seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random paged keys and values ``(blocks, kvH, bt, D)`` and a scattered block table ``(B, blocks per row)``."""
    gen = torch.Generator().manual_seed(seed)
    per_row = -(-longest // block_tokens)
    blocks = batch * per_row + 3  # some ids unused
    table = torch.randperm(blocks, generator=gen)[: batch * per_row].view(batch, per_row).to(torch.int32)
    keys = torch.randn(blocks, kv_heads, block_tokens, dim, generator=gen)
    values = torch.randn(blocks, kv_heads, block_tokens, dim, generator=gen)
    return keys.to(DEVICE), values.to(DEVICE), table.to(DEVICE)


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, table: torch.Tensor,
               positions: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """Each row's softmax attention over its keys ``0 .. position``, gathered from the pool: ``(B, 1, H*D)``."""
    batch, _, heads, dim = q.shape
    kv_heads, block_tokens = keys.shape[1], keys.shape[2]
    out = []
    for b in range(batch):
        p = torch.arange(int(positions[b]) + 1, device=keys.device)
        blocks = table[b, p // block_tokens].long()
        k = keys[blocks, :, p % block_tokens].transpose(0, 1)  # (kvH, n, D)
        v = values[blocks, :, p % block_tokens].transpose(0, 1)
        rows = q[b, 0].view(kv_heads, heads // kv_heads, dim)  # (kvH, G, D)
        weights = torch.softmax(rows @ k.transpose(1, 2) / dim**0.5, dim=-1)  # (kvH, G, n)
        out.append((weights @ v).reshape(1, heads * dim))
    want = torch.stack(out)  # (B, 1, H*D)
    return want if gate is None else want * torch.sigmoid(gate.reshape(want.shape))


def test_the_split_count_is_a_constant_of_the_model() -> None:
    # about 128 programs for one sequence, 16 .. 64 ranges: Llama-3's 8 KV heads keep 16, Qwen3.6's 2 take 64
    assert [decode_splits(kv) for kv in (1, 2, 4, 8, 16, 32)] == [64, 64, 32, 16, 16, 16]
    assert all(MIN_SPLITS <= decode_splits(kv) <= MAX_SPLITS for kv in range(1, 80))
    assert decode_partial_values(32, 8, 128) == 32 * 16 * (128 + 2)  # max, sum and the weighted values
    with pytest.raises(ValueError, match="KV head"):
        decode_splits(0)


@pytest.mark.parametrize(("kv_heads", "groups", "block_tokens", "lengths"), [
    (2, 4, 16, (1, 17, 64, 300)),  # 64 ranges: one tile each, a length on a block boundary, mid-block ends
    (8, 1, 64, (65, 1500)),  # 16 ranges of 128 keys at 1,500: two tiles a range, the last range partial
    (1, 3, 32, (1100, 2)),  # 64 ranges: 18 used at 1,100, more than the combine merges at once
])
def test_decode_attention_matches_attention_over_each_rows_keys(kv_heads: int, groups: int, block_tokens: int,
                                                                 lengths: tuple[int, ...]) -> None:
    torch.manual_seed(kv_heads)
    dim, heads, batch = 32, kv_heads * groups, len(lengths)
    keys, values, table = _pool(batch, kv_heads, block_tokens, dim, max(lengths), seed=groups)
    positions = torch.tensor(lengths, device=DEVICE)[:, None] - 1  # (B, 1)
    q = torch.randn(batch, 1, heads, dim, device=DEVICE)
    gate = torch.randn(batch, 1, heads, 2 * dim, device=DEVICE)[..., dim:]  # strided, as chunk() leaves it
    torch.testing.assert_close(decode_attention(q, keys, values, table, positions),
                               _reference(q, keys, values, table, positions, None), **TOL)
    torch.testing.assert_close(decode_attention(q, keys, values, table, positions, gate),
                               _reference(q, keys, values, table, positions, gate), **TOL)
    if kv_heads == 1:
        assert -(-lengths[0] // KV_BLOCK_TOKENS) > MERGE_SPLITS  # the case the merge loop exists for


def test_a_rows_output_is_the_same_bits_whatever_shares_its_batch() -> None:
    """Row ``r`` alone, then beside longer and shorter rows in other orders: the same bits (its key ranges
    and every reduction order come from its own position)."""
    torch.manual_seed(5)
    kv_heads, groups, dim, block_tokens = 2, 2, 32, 16
    lengths = (90, 2500, 7, 700)
    keys, values, table = _pool(len(lengths), kv_heads, block_tokens, dim, max(lengths), seed=6)
    positions = torch.tensor(lengths, device=DEVICE)[:, None] - 1
    q = torch.randn(len(lengths), 1, kv_heads * groups, dim, device=DEVICE)
    gate = torch.randn(len(lengths), 1, kv_heads * groups, dim, device=DEVICE)
    together = decode_attention(q, keys, values, table, positions, gate)
    for order in ([0], [3, 0], [1, 0, 2], [2, 3, 1, 0]):
        rows = torch.tensor(order, device=DEVICE)
        got = decode_attention(q[rows], keys, values, table[rows], positions[rows], gate[rows])
        for i, r in enumerate(order):
            assert torch.equal(got[i], together[r]), f"row {r} changed beside rows {order}"


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3.6"])  # attention only; hybrid with the output gate
def test_a_decode_step_is_the_same_bits_at_every_attended_length(preset: str) -> None:
    """A stage's decode step (the kernels through the interpreter) gives the same logits whatever attended
    length it is run at, the row's own or a graph's (a bucket, the context): one graph serves them all."""
    context = 4096
    loaded = load_model(f"random:{preset}", "cpu:1x1GiB", "single", context)
    try:
        model = loaded.pipeline.stages[0].model
        states = model.new_states(2, context, torch.float32, torch.device("cpu"))
        gen = torch.Generator().manual_seed(7)
        for i in model.block_indices:
            cache = states[i]
            if isinstance(cache, KVCache):  # keys and values already there, at every position
                cache.key.copy_(torch.randn(cache.key.shape, generator=gen))
                cache.value.copy_(torch.randn(cache.value.shape, generator=gen))
        tokens = torch.tensor([[3], [11]])
        positions = torch.tensor([[1499], [40]])  # 1,500 keys: ranges of 64 keys at its own length, 2 rows
        logits = []
        with kernels_on_host(), torch.inference_mode():
            for kv_length in (1500, 2048, context):  # the row's own extent, its bucket, the whole context
                out = model(tokens, positions, states, start=None, kv_length=kv_length)
                assert out.logits is not None
                logits.append(out.logits.clone())
        assert all(torch.equal(logits[0], other) for other in logits[1:])
        assert logits[0].abs().sum() > 0
    finally:
        loaded.close()
