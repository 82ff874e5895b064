"""Split-K tile counters: made and zeroed outside CUDA graph captures only (issue 44's non-finite logits: a
buffer first made inside a packed piece's capture held garbage for the eager passes before the next decode
graph's capture on the same stream)."""

from __future__ import annotations

import pytest
import torch

from stagewise.kernels import moe_decode_triton
from stagewise.kernels.moe_decode_triton import reserve_tile_counters, tile_counters

CPU = torch.device("cpu")


def test_counters_are_never_made_inside_a_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moe_decode_triton, "_locks", {})
    monkeypatch.setattr(moe_decode_triton, "capturing", lambda device: True)  # on the host: as if capturing
    with pytest.raises(RuntimeError, match="reserve_tile_counters"):
        tile_counters(CPU, 10)


def test_reserved_counters_serve_a_capture_up_to_their_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moe_decode_triton, "_locks", {})
    reserve_tile_counters(CPU, 100)
    made = tile_counters(CPU, 10)
    assert made.numel() >= 100 and not made.any()  # zeroed when made, outside the capture
    monkeypatch.setattr(moe_decode_triton, "capturing", lambda device: True)
    assert tile_counters(CPU, 100).data_ptr() == made.data_ptr()  # the capture reads the reserved buffer
    with pytest.raises(RuntimeError, match=f"{made.numel() + 1} tiles"):
        tile_counters(CPU, made.numel() + 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_decode_graph_stream_counts_from_zero_after_a_capture() -> None:
    """On a stream of its own: a capture of a split-K Q8_0 decode GEMM without reserved counters raises;
    with them (as StepGraphs makes them), the capture, its replay and an eager launch on that stream after it
    all give the plain launch's result."""
    from stagewise.kernels.q8_0_gemm import decode_tiles, q8_0_gemm

    device = torch.device("cuda")
    assert decode_tiles(24, 96, 2048)[1].split_k > 1  # 96 outputs, 2,048 inputs, 24 rows: K split
    torch.manual_seed(0)
    qs = torch.randint(-127, 128, (96, 2048), dtype=torch.int8, device=device)
    scales = (torch.rand(96, 64, device=device) * 0.01).to(torch.float16)
    x = torch.randn(24, 2048, device=device, dtype=torch.bfloat16)
    want = q8_0_gemm(x, qs, scales)
    stream = torch.cuda.Stream(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), pytest.raises(RuntimeError, match="reserve_tile_counters"):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            q8_0_gemm(x, qs, scales)
        finally:
            graph.capture_end()
    with torch.cuda.stream(stream):
        reserve_tile_counters(device)
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(capture_error_mode="thread_local")
        out = q8_0_gemm(x, qs, scales)
        graph.capture_end()
        eager = q8_0_gemm(x, qs, scales)  # on the capture stream, before any replay
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager, want) and torch.equal(out, want)
