"""The load check: planned vs measured for every part, the workspace measured as the allocator's peak.

On the CPU the warm-up's full-context step runs (the same requests the GPU runs) and the workspace is
reported as not measured; the banner and the status view say so. On a GPU (marked tests) the peak over
the warm-up and a full-context step stays within the certified charge of every stage.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from stagewise.engine.engine import Engine
from stagewise.engine.model_loading import load_model
from stagewise.engine.warm_up import full_context_prompt
from stagewise.runtime.peak_memory import PeakMemory, PeakMeter, graph_pool_idle_bytes
from stagewise.runtime.stage import ChargeCheck
from stagewise.server.load_display import check_line, placement_lines
from stagewise.server.placement_view import placement_view
from stagewise.server.random_tokenizer import with_demo_tokenizer


@pytest.mark.parametrize(("tokens", "chunk", "prompt"), [(4096, 512, 3584), (4097, 512, 4096), (300, 512, 299),
                                                         (96, 16, 80)])
def test_full_context_prompt_is_whole_chunks_up_to_the_context(tokens: int, chunk: int, prompt: int) -> None:
    assert full_context_prompt(SimpleNamespace(sequence_tokens=tokens, prefill_chunk=chunk)) == prompt  # type: ignore[arg-type]


def _check(peak: int | None) -> ChargeCheck:
    return ChargeCheck(0, "cuda:0", 1_000, 1_000, 800, 800, 200, 200, 300, None if peak is None else peak - 1_000,
                       1_310, peak)


def test_banner_shows_every_part_planned_beside_measured() -> None:
    line = check_line(_check(1_250))
    assert "weights 800 B · 800 B" in line and "state 200 B · 200 B" in line
    assert "workspace 300 B · 250 B (peak above resident)" in line
    assert "total 1.3 KB certified · peak 1.2 KB (0.954, within)" in line
    assert "OVER" in check_line(_check(1_400))
    assert "workspace 300 B · not measured" in check_line(_check(None))
    assert _check(1_250).to_dict()["measured"] == {"weights_bytes": 800, "state_bytes": 200, "workspace_bytes": 250,
                                                    "peak_bytes": 1_250}


def test_peak_memory_reading() -> None:
    assert PeakMemory("cuda:0", 1_000, 1_300).workspace_bytes == 300
    assert PeakMemory("cuda:0", 1_000, 900).workspace_bytes == 0


def test_graph_pool_idle_bytes_are_the_private_pools_free_blocks_of_the_device() -> None:
    segments = [
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 100, "allocated_size": 10},  # the cache: released on OOM
        {"device": 0, "segment_pool_id": (1, 0), "total_size": 64, "allocated_size": 16},  # a graph's: 48 idle
        {"device": 0, "segment_pool_id": [2, 0], "total_size": 8, "allocated_size": 0},  # another graph's
        {"device": 1, "segment_pool_id": (1, 0), "total_size": 32, "allocated_size": 0},  # another device
    ]
    assert graph_pool_idle_bytes(segments, 0) == 56
    assert graph_pool_idle_bytes(segments, 1) == 32
    assert graph_pool_idle_bytes(segments, 2) == 0
    assert PeakMemory("cuda:0", 1_000, 1_300, 200).to_dict()["graph_pool_bytes"] == 200


def test_warm_up_runs_a_full_context_step_and_reports_the_parts_on_cpu() -> None:
    model = with_demo_tokenizer(load_model("random:tiny-qwen3.6", "cpu:1x1GiB", "single", 96, max_seqs=2,
                                           prefill_chunk=16))
    try:
        done = Engine(model).warm_up()
        assert done.full_context_tokens == 80  # 5 chunks of 16 below the 96-position context
        assert "a full-context step (80-token prompt)" in done.summary()
        assert model.peaks == {}  # CPU devices: no allocator peak to read
        checks = model.charge_checks()
        assert checks[0].measured_weights_bytes == checks[0].planned_weights_bytes
        assert checks[0].measured_workspace_bytes is None
        lines = placement_lines(model)
        assert lines[1] == "  profile: 96 positions, 2 sequences, prefill chunks of 16"
        assert "workspace" in lines[2] and "not measured" in lines[2]
        stage = placement_view(model)["stages"][0]
        assert stage["measured"]["workspace_bytes"] is None and stage["measured"]["weights_bytes"] > 0
        assert placement_view(model)["profile"]["prefill_chunk_tokens"] == 16
    finally:
        model.close()


def _charge_checks_after_warm_up(preset: str) -> tuple[int, list[dict[str, Any]]]:
    """In a process of its own: what the device held before loading, and each stage's check after warm-up."""
    before = torch.cuda.memory_allocated(0)
    model = with_demo_tokenizer(load_model(preset, "cuda:0", "single", 2048, max_seqs=4))
    try:
        Engine(model).warm_up()
        return before, [check.to_dict() for check in model.charge_checks()]
    finally:
        model.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("preset", ["random:tiny-llama", "random:tiny-qwen3.6@q4_k", "random:tiny-qwen3-moe@q8_0"])
def test_measured_peak_within_the_certified_charge_on_the_gpu(preset: str) -> None:
    """The peak is the device's whole allocator peak, so the model loads in a fresh process: in this one,
    other tests' tensors and cuBLAS workspaces would count (a first GPU run: 110 MB resident for a model of
    a few MB, its measured workspace within the plan, its peak twice the charge)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        before, checks = pool.submit(_charge_checks_after_warm_up, preset).result()
    assert before == 0
    for check in checks:
        planned, measured = check["planned"], check["measured"]
        assert measured["peak_bytes"] is not None and measured["workspace_bytes"] is not None
        assert measured["peak_bytes"] <= planned["total_bytes"], check
        assert measured["workspace_bytes"] <= planned["workspace_bytes"], check


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_reading_counts_what_a_captured_graph_keeps_after_its_tensors_are_freed() -> None:
    x = torch.ones(1 << 20, device="cuda:0")  # 4 MiB
    meter = PeakMeter(["cuda:0"])
    meter.start()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (x * 2 + 1).sum()  # warm the kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        total = (x * 2 + 1).sum()  # two 4 MiB temporaries, freed inside the capture: the pool keeps them
    meter.checkpoint()
    reading = meter.read()["cuda:0"]
    assert reading.graph_pool_bytes >= 2 * x.nbytes
    assert reading.workspace_bytes >= reading.graph_pool_bytes  # on the device beside whatever steps allocate now
    graph.replay()
    assert total.item() == 3 * x.numel()
