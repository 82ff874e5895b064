"""Workspace charges by kernel path (stagewise/spec/workspace_bytes.py): what lives beside what."""

from __future__ import annotations

from stagewise.placement.stage_table import StageTable
from stagewise.spec.block_spec import BlockSpec
from stagewise.spec.charge import stage_charge
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile
from stagewise.spec.workspace_bytes import (
    GRAPH_POOL_SEGMENT_BYTES,
    block_pool_bytes,
    block_workspace_bytes,
    graph_output_bytes,
    graph_pool_top_up_bytes,
    tile_bytes,
)
from stagewise.weights.make_model import load_hf_config

MATRICES = ((4096, 2048), (2048, 4096))  # a dequantized tile of 2^24 values at most, plus its output


def _linear(state_values: int = 32 * 128 * 128) -> BlockSpec:
    return BlockSpec(index=0, mixer="linear_attention", moe=False, weight_bytes=1, read_bytes_per_token=1,
                     flops_per_token=1, conv_state_values=8192 * 4, recurrent_state_values=state_values,
                     step_values_per_token=30_000, step_f32_values_per_token=50_000, mix_values_per_token=8192,
                     matrices=MATRICES)


def _profile(batch: int, graphs: bool, path: str = "triton") -> Profile:
    return Profile(context_tokens=4096, batch=batch, prefill_chunk_tokens=512, kernel_path=path, cuda_graphs=graphs)


def test_decoding_rows_state_entries_take_no_workspace_on_the_triton_path() -> None:
    # the decode kernels read one entry of the pool and write another: nothing grows with the rows' state
    for graphs in (False, True):
        small, large = (block_workspace_bytes(_linear(s), _profile(64, graphs), "q4_k") for s in (1, 32 * 128 * 128))
        assert small == large
    # the torch path gathers each row's entry and computes the new one beside it
    assert block_workspace_bytes(_linear(1), _profile(64, False, "torch"), "q4_k") < \
        block_workspace_bytes(_linear(), _profile(64, False, "torch"), "q4_k")


def test_with_graphs_the_eager_mixer_is_charged_beside_the_graphs_pool() -> None:
    block, tokens = _linear(), _profile(1, True).step_tokens
    values, f32, mix = tokens * 30_000 * 2, tokens * 50_000 * 4, tokens * 8192 * 2
    eager = block_workspace_bytes(block, _profile(1, False), "q4_k")
    graphs = block_workspace_bytes(block, _profile(1, True), "q4_k")
    tile = tile_bytes(MATRICES, "q4_k", tokens, _profile(1, True), "triton")
    assert 0 < tile < f32 and eager == values + f32  # eagerly the tile and the scan never live at once
    # the pieces' values and tile stay in the pool while the mixer's own temporaries and scan run beside them
    assert graphs == values + tile + mix + f32


def test_a_small_model_s_graph_pool_is_charged_a_whole_segment() -> None:
    """The caching allocator holds blocks of up to 1 MiB in 2 MiB segments, the graphs' pool too (an H100: tiny
    models measured 0.85 MB above a charge that counted their tensors alone): the first segment's rest is charged
    where the plan's pool contents are below one, and nothing where they pass it."""
    def spec(preset: str) -> ModelSpec:
        return ModelSpec.from_config(ModelConfig.from_hf_dict(load_hf_config(preset)), "bf16")

    tiny, big = spec("tiny-llama"), spec("llama-3.1-8b")
    graphs = Profile(context_tokens=2048, batch=4, prefill_chunk_tokens=512, kernel_path="triton", cuda_graphs=True)
    least = min(block_pool_bytes(b, graphs) for b in tiny.blocks)
    top_up = graph_pool_top_up_bytes(tiny, graphs)
    assert 0 < top_up == GRAPH_POOL_SEGMENT_BYTES - least - graph_output_bytes(tiny, graphs, False)
    assert graph_pool_top_up_bytes(big, graphs) == 0  # a real model's pool passes a segment
    for path, cuda_graphs in (("torch", False), ("triton", False)):
        off = Profile(context_tokens=2048, batch=4, prefill_chunk_tokens=512, kernel_path=path, cuda_graphs=cuda_graphs)
        assert graph_pool_top_up_bytes(tiny, off) == 0  # no graphs, no pool
    # the planner's table prices a stage as the charge does, top-up included
    n = tiny.num_blocks
    with_top_up = stage_charge(tiny, graphs, 0, n, entry=True, exit=True).total_bytes
    assert StageTable.build(tiny, graphs).range_total(0, n, True, True) == with_top_up
