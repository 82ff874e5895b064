"""Workspace charges by kernel path (stagewise/spec/workspace_bytes.py): what lives beside what."""

from __future__ import annotations

from stagewise.spec.block_spec import BlockSpec
from stagewise.spec.profile import Profile
from stagewise.spec.workspace_bytes import block_workspace_bytes, tile_bytes

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
