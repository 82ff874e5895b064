"""The identity alignment a dense Q8_0 / packed matmul of 17+ rows runs on (kernels/moe_align.py): built
once per (rows, block, device); one handed out while a CUDA graph is captured is never freed, because the
graph holds its addresses.

Issue 44: a decode graph captured at warm-up (e.g. 63 rows) is first replayed only when a 64-stream
burst's first sequences finish; meanwhile the burst's packed steps, one alignment per token count,
had pushed its alignment out of a 64-entry LRU cache: the graph then read freed memory as its row
order, block experts and block count (rows written to the wrong place, left unwritten, or read from
no row at all)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from stagewise.kernels import moe_align
from stagewise.kernels.moe_align import identity_alignment

CPU = torch.device("cpu")


def test_an_alignment_a_graph_captured_outlives_every_other_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moe_align, "_CAPTURED", {})
    identity_alignment(63, 64, CPU)  # the eager passes before the capture make it
    monkeypatch.setattr(moe_align, "capturing", lambda device: True)  # on the host: as if capturing
    captured = identity_alignment(63, 64, CPU)  # a decode graph of 63 rows, captured at warm-up
    monkeypatch.setattr(moe_align, "capturing", lambda device: False)
    # a graph keeps addresses, not references: what it reads must stay alive on its own
    tensors = [weakref.ref(t) for t in (captured.sorted_slots, captured.block_expert, captured.num_valid_blocks)]
    addresses = [t.data_ptr() for t in (captured.sorted_slots, captured.block_expert, captured.num_valid_blocks)]
    del captured
    for tokens in range(65, 65 + 200):  # a burst's packed steps: one alignment per token count
        identity_alignment(tokens, 64, CPU)
    gc.collect()
    assert all(ref() is not None for ref in tensors), "an alignment a captured graph reads was freed"
    again = identity_alignment(63, 64, CPU)  # the eager path gets the very tensors the graph reads
    assert [t.data_ptr() for t in (again.sorted_slots, again.block_expert, again.num_valid_blocks)] == addresses


def test_the_identity_alignment_is_the_identity() -> None:
    got = identity_alignment(40, 64, CPU)
    assert got.sorted_slots.tolist() == list(range(40)) + [40] * 24  # padding = rows
    assert got.block_expert.tolist() == [0] and got.num_valid_blocks.tolist() == [1]
    assert (got.num_slots, got.block_m) == (40, 64)


def test_an_alignment_is_never_first_made_inside_a_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    # made inside a capture its tensors would hold nothing until a replay, and be handed out for good
    monkeypatch.setattr(moe_align, "_CAPTURED", {})
    monkeypatch.setattr(moe_align, "capturing", lambda device: True)  # on the host: as if capturing
    with pytest.raises(RuntimeError, match="inside a CUDA graph capture"):
        identity_alignment(77, 16, CPU)
    monkeypatch.setattr(moe_align, "capturing", lambda device: False)
    assert moe_align._identity_alignment.cache_info().currsize == 0  # what the capture made is nobody's
    eager = identity_alignment(78, 16, CPU)  # the eager pass before a capture makes it
    monkeypatch.setattr(moe_align, "capturing", lambda device: True)
    assert identity_alignment(78, 16, CPU) is eager
