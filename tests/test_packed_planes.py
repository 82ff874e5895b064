"""The plane repack of packed GGUF rows: lossless, the file's bytes, dequantized bit for bit as gguf.quants does.

Every packed type's rows are split into quant, high-bit and meta planes at load; joining them gives
back the file's bytes, ``PackedWeight.dequantize`` equals ``gguf.quants.dequantize`` exactly, the
resident bytes are the file's, and the loader's bounded slabs give the same planes as one split.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from stagewise.spec.packed_types import PACKED, PLANES, block_bytes, plane_row_bytes, row_bytes
from stagewise.weights.quant import packed_planes
from stagewise.weights.quant.packed_planes import join_planes, planes_from_rows, split_planes
from stagewise.weights.quant.packed_weight import PackedWeight

T = GGMLQuantizationType
TYPES = sorted((t for t in PACKED if t != T.Q8_0), key=int)
# byte offsets of each block's f16 scales (kept finite: NaN != NaN would hide a mismatch)
F16_AT = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q2_K: [80, 82], T.Q3_K: [108],
          T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: []}


def _random_rows(qtype: GGMLQuantizationType, rows: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    block, type_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, k // block, type_bytes), dtype=np.uint8)
    for at in F16_AT[qtype]:
        raw[..., at : at + 2] = rng.normal(0, 0.05, size=(rows, k // block, 1)).astype(np.float16).view(np.uint8)
    if qtype == T.MXFP4:
        raw[..., 0] = rng.integers(0, 200, size=(rows, k // block))
    return raw.reshape(rows, -1)


def test_the_plane_table_covers_every_packed_type_byte_for_byte() -> None:
    assert set(PLANES) == set(PACKED)
    for qtype, layout in PLANES.items():
        assert layout.block_bytes == block_bytes(qtype)
        taken = [*range(*layout.qs), *range(*layout.qh), *(b for lo, hi in layout.meta_ranges() for b in range(lo, hi))]
        assert sorted(taken) == list(range(layout.block_bytes)), qtype.name  # every byte in exactly one plane
        assert sum(plane_row_bytes(qtype, 4096)) == row_bytes(qtype, 4096)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_planes_hold_the_files_bytes_and_dequantize_exactly(qtype: GGMLQuantizationType) -> None:
    k = 512
    raw = _random_rows(qtype, rows=6, k=k, seed=int(qtype))
    rows = torch.from_numpy(raw.copy())
    weight = PackedWeight.from_rows(rows, qtype, k)
    assert weight.nbytes == raw.size and weight.shape == (6, k)  # charged the file's bytes, exactly
    assert torch.equal(weight.rows(), rows)
    assert weight.qs.shape[-1] == PLANES[qtype].qs_bytes * k // GGML_QUANT_SIZES[qtype][0]
    want = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    assert torch.equal(weight.dequantize(torch.float32), want)
    stack = PackedWeight.from_rows(rows.reshape(2, 3, -1), qtype, k)  # an expert stack: (E, N, plane bytes)
    assert torch.equal(stack.expert(1).dequantize(), want[3:])
    assert torch.equal(weight.embed(torch.tensor([[5, 0]]), torch.float32), want[[5, 0]][None])


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q5_0], ids=lambda t: t.name)
def test_the_loader_repacks_in_bounded_slabs(qtype: GGMLQuantizationType, monkeypatch: pytest.MonkeyPatch) -> None:
    k = 256
    rows = torch.from_numpy(_random_rows(qtype, rows=11, k=k, seed=1).copy())
    monkeypatch.setattr(packed_planes, "REPACK_SLAB_BYTES", 3 * row_bytes(qtype, k))  # 3 rows a slab: 4 slabs
    seen: list[int] = []
    planes = planes_from_rows(rows, qtype, k, torch.device("cpu"), check=lambda slab: seen.append(slab.shape[0]))
    assert seen == [3, 3, 3, 2]
    for got, want in zip(planes, split_planes(rows, qtype), strict=True):
        assert torch.equal(got, want)
    assert torch.equal(join_planes(*planes, qtype), rows)


def test_joined_weights_keep_their_planes_in_block_order() -> None:
    qtype, k = T.Q5_K, 256
    a = torch.from_numpy(_random_rows(qtype, rows=4, k=k, seed=2).copy())
    b = torch.from_numpy(_random_rows(qtype, rows=4, k=k, seed=3).copy())
    wa, wb = PackedWeight.from_rows(a, qtype, k), PackedWeight.from_rows(b, qtype, k)
    assert torch.equal(PackedWeight.concat([wa, wb], 0).rows(), torch.cat([a, b], 0))  # rows (fused q/k/v)
    assert torch.equal(PackedWeight.concat([wa, wb], -1).rows(), torch.cat([a, b], 1))  # each row's blocks
    assert torch.equal(wa.select_rows(torch.tensor([3, 1])).rows(), a[[3, 1]])


def test_bad_planes_are_refused() -> None:
    qs, qh, meta = split_planes(torch.from_numpy(_random_rows(T.Q4_K, rows=2, k=256, seed=0).copy()), T.Q4_K)
    with pytest.raises(ValueError, match="do not hold 512 values"):
        PackedWeight(qs, qh, meta, T.Q4_K, 512)
    with pytest.raises(ValueError, match="one lead shape"):
        PackedWeight(qs, qh, meta[:1], T.Q4_K, 256)
