"""The paged KV gather on the CPU reads the blocks attended, never the whole pool: one stream of a
model served with many sequence slots decodes as fast as with one (its cost followed --max-seqs).

Checked by memory, not by time: the largest buffer the gather allocates (torch's profiler) is the
attended keys, far below the pool's size, and the values are the blocks' own.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from stagewise.models.block_table import BlockTable
from stagewise.models.kv_cache import KVCache

ROWS, CONTEXT, KV_HEADS, HEAD_DIM = 64, 4096, 2, 16  # a pool of 64 rows x 4096 positions


def _cache() -> KVCache:
    table = BlockTable(ROWS, CONTEXT, ROWS * CONTEXT // 64, torch.device("cpu"))
    cache = KVCache(table, KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu"))
    cache.key.copy_(torch.randn(cache.key.shape))
    cache.value.copy_(torch.randn(cache.value.shape))
    table.set_row(5, [900, 17, 3001])  # row 5's positions 0..191 live in blocks 900, 17, 3001
    return cache


def test_view_returns_the_rows_blocks_in_position_order() -> None:
    cache = _cache()
    keys, values = cache.view(slice(5, 6), 150)  # (1, kvH, 150, D)
    assert keys.shape == (1, KV_HEADS, 150, HEAD_DIM)
    want = torch.cat([cache.key[b] for b in (900, 17, 3001)], dim=1)[:, :150]  # (kvH, 150, D)
    assert torch.equal(keys[0], want)
    assert torch.equal(values[0], torch.cat([cache.value[b] for b in (900, 17, 3001)], dim=1)[:, :150])


def test_view_allocates_what_is_attended_not_the_pool() -> None:
    cache = _cache()
    pool_bytes = cache.key.numel() * cache.key.element_size()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        cache.view(slice(5, 6), 150)
    largest = max(event.cpu_memory_usage for event in prof.events())
    attended_bytes = 3 * 64 * KV_HEADS * HEAD_DIM * 4  # 3 blocks of 64 positions, fp32
    assert largest <= 2 * attended_bytes < pool_bytes // 100, (largest, pool_bytes)
