"""The panel Q8_0 layout: the reorder is exact and in place, the torch paths read it as the row-major
weight, and every Q8_0 kernel (decode GEMM and its SiLU·up form, prefill grouped GEMM, GEMV, the dense
matmul) gives bit for bit the result it gives from the row-major weight. Kernels run compiled on a GPU,
else in Triton's interpreter (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from stagewise.models.layers.experts import Experts
from stagewise.weights.quant import q8_0 as q8_0_module
from stagewise.weights.quant.q8_0 import Q8_0Weight
from stagewise.weights.quant.q8_0_layout import panel_layout, row_major_layout

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _weight(*shape: int, seed: int = 0) -> Q8_0Weight:
    g = torch.Generator().manual_seed(seed)
    qs = torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)
    scales = (torch.rand(*shape[:-1], shape[-1] // 32, generator=g) * 0.01 + 0.001).to(torch.float16)
    return Q8_0Weight(qs, scales).to(DEVICE)


def _pair(*shape: int, seed: int = 0) -> tuple[Q8_0Weight, Q8_0Weight]:
    """The same weight row-major and in panels."""
    return _weight(*shape, seed=seed), _weight(*shape, seed=seed).to_panels()


def test_panels_are_exact_and_in_place() -> None:
    rows, panels = _pair(3, 96, 96)  # 96 rows: not a whole number of the kernels' 64-row address tiles
    fresh = _weight(3, 96, 96)
    ptr = fresh.qs.data_ptr()
    assert fresh.to_panels().qs.data_ptr() == ptr  # the same storage, reordered
    assert panels.panels and panels.shape == (3, 96, 96) and panels.nbytes == rows.nbytes
    assert tuple(panels.qs.shape) == (3, 3, 96, 32) and tuple(panels.scales.shape) == (3, 3, 96)
    assert panels.layout == panel_layout(96, 96, stack=True) and panels.layout.panels
    assert not rows.layout.panels and rows.layout == row_major_layout(rows.qs, rows.scales)
    lay = panels.layout
    for e, n, k in ((2, 77, 45), (0, 0, 0), (1, 95, 95), (2, 64, 32)):  # value (e, n, k) at its address
        at = (e * lay.expert + (n // 64) * lay.row_tile + (n % 64) * lay.row + (k // 32) * lay.block
              + (k % 32) * lay.element)
        assert int(panels.qs.reshape(-1)[at]) == int(rows.qs[e, n, k])
        s_at = (e * lay.scale_expert + (n // 64) * lay.scale_row_tile + (n % 64) * lay.scale_row
                + (k // 32) * lay.scale_block)
        assert float(panels.scales.reshape(-1)[s_at]) == float(rows.scales[e, n, k // 32])
    assert torch.equal(panels.dequantize(), rows.dequantize())
    assert torch.equal(panels.expert(1).dequantize(), rows.expert(1).dequantize())
    assert panels.expert(1).panels and panels.expert(1).shape == (96, 96)
    assert "panels" in repr(panels)


def test_panels_refuse_what_they_cannot_hold() -> None:
    strided = Q8_0Weight(torch.zeros(64, 2, 64, dtype=torch.int8).transpose(0, 1), torch.zeros(2, 64, 2).half())
    assert not strided.can_make_panels()
    with pytest.raises(ValueError, match="cannot be made panels"):
        strided.to_panels()
    panels = _weight(2, 64, 64).to_panels()
    assert not panels.can_make_panels()
    with pytest.raises(ValueError, match="row-major"):
        panels.fill_from_blocks(torch.zeros(2 * 64 * 2 * 34, dtype=torch.uint8))
    with pytest.raises(ValueError, match="panels"):
        Q8_0Weight(panels.qs.reshape(2, 64, 64), panels.scales, panels=True)


def test_torch_paths_read_panels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference paths (CPU, ``STAGEWISE_KERNELS=torch``) give the row-major weight's results bit for bit,
    including matmul tiles of rows that start and end anywhere."""
    monkeypatch.setattr(q8_0_module, "use_triton", lambda t: False)
    rows, panels = _pair(4, 200, 64, seed=1)
    x = torch.randn(5, 64, device=DEVICE)
    monkeypatch.setattr(q8_0_module, "TILE_ELEMENTS", 40 * 64)  # 40-row matmul tiles
    for e in range(4):
        assert torch.equal(panels.expert(e).matmul(x), rows.expert(e).matmul(x))
    index = torch.tensor([3, 0, 0, 2, 1, 3], device=DEVICE)
    assert torch.equal(panels.gather_matmul(index, x[:3], x_repeat=2), rows.gather_matmul(index, x[:3], x_repeat=2))
    assert panels.to(DEVICE).panels


def test_gemv_reads_panels() -> None:
    from stagewise.weights.quant.q8_0_gemv_triton import q8_0_gemv

    rows, panels = _pair(4, 96, 256, seed=2)
    x = torch.randn(3, 256, device=DEVICE)
    index = torch.tensor([3, 1, 0, 0, 2, 3], device=DEVICE)
    for config in ((4, 128, 2, 2), (16, 64, 2, 2), (64, 32, 2, 2)):
        want = q8_0_gemv(x, rows, index, config=config, x_repeat=2)
        assert torch.equal(q8_0_gemv(x, panels, index, config=config, x_repeat=2), want)
        assert torch.equal(q8_0_gemv(x[:1], panels.expert(2), config=config), q8_0_gemv(x[:1], rows.expert(2), config=config))


@pytest.mark.parametrize("rows_in", [20, 70], ids=["decode_rows", "prefill_rows"])
def test_dense_matmul_reads_panels(rows_in: int) -> None:
    from stagewise.kernels.q8_0_gemm import q8_0_gemm

    rows, panels = _pair(1, 96, 256, seed=3)
    x = torch.randn(rows_in, 256, device=DEVICE)
    assert torch.equal(q8_0_gemm(x, panels.expert(0)), q8_0_gemm(x, rows.expert(0)))


def test_expert_kernels_read_panels() -> None:
    """Decode GEMM (plain, swapped, split K, TMA, SiLU·up) and the prefill grouped GEMM: panels equal row-major."""
    from stagewise.kernels.moe_align import moe_align
    from stagewise.kernels.moe_decode_triton import DecodeTiles, decode_gemm, decode_gemm_glu
    from stagewise.kernels.moe_grouped_triton import GemmTiles, grouped_gemm

    experts, top_k, tokens, k_in = 4, 2, 6, 128
    g = torch.Generator().manual_seed(4)
    top_index = torch.topk(torch.rand(tokens, experts, generator=g), top_k, dim=-1).indices.to(DEVICE)
    top_weight = torch.rand(tokens, top_k, generator=g).to(DEVICE)
    gate_up, gate_up_panels = _pair(experts, 96, k_in, seed=5)  # 2 x 48 intermediate rows: ragged tiles
    x = torch.randn(tokens, k_in, device=DEVICE)
    align = moe_align(top_index, experts, block_m=16)
    for tiles in (DecodeTiles(32, 64, 4, 1), DecodeTiles(64, 32, 4, 1, swap=True),
                  DecodeTiles(32, 32, 4, 1, split_k=2, swap=True), DecodeTiles(64, 64, 4, 1, swap=True, tma=True),
                  DecodeTiles(32, 32, 4, 1, split_k=2, swap=True, tma=True)):
        want = decode_gemm(x, gate_up, align, top_k, tiles, gather_rows=True, top_weight=top_weight)
        got = decode_gemm(x, gate_up_panels, align, top_k, tiles, gather_rows=True, top_weight=top_weight)
        assert torch.equal(got, want), tiles
        want = decode_gemm_glu(x, gate_up, align, top_k, tiles, gather_rows=True)
        assert torch.equal(decode_gemm_glu(x, gate_up_panels, align, top_k, tiles, gather_rows=True), want), tiles
    prefill = GemmTiles(32, 64, 4, 1, 2)
    want = grouped_gemm(x, gate_up, align, top_k, prefill, gather_rows=True, top_weight=top_weight)
    assert torch.equal(grouped_gemm(x, gate_up_panels, align, top_k, prefill, gather_rows=True, top_weight=top_weight),
                       want)


def test_experts_make_panels_for_the_triton_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q8_0 stack arriving for the Triton path is made panels; for the torch path it stays row-major."""
    ex = Experts(num_experts=2, hidden_size=64, intermediate_size=64)
    monkeypatch.setattr("stagewise.models.layers.experts.use_triton", lambda t: True)
    ex.set_quantized_param("gate_up_proj", _weight(2, 128, 64))
    assert isinstance(ex.quantized["gate_up_proj"], Q8_0Weight) and ex.quantized["gate_up_proj"].panels
    ex.set_quantized_param("down_proj", _weight(2, 64, 64))
    assert ex.quantized["down_proj"].panels  # type: ignore[attr-defined]
    monkeypatch.setattr("stagewise.models.layers.experts.use_triton", lambda t: False)
    plain = Experts(num_experts=2, hidden_size=64, intermediate_size=64)
    plain.set_quantized_param("gate_up_proj", _weight(2, 128, 64))
    assert not plain.quantized["gate_up_proj"].panels  # type: ignore[attr-defined]
