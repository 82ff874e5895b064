"""The fused Triton kernels against the reference torch path, run by Triton's interpreter on CPU.

Each kernel is checked alone (float32, tight tolerance; strided inputs as the layers pass them),
then whole tiny models: prefill + decode with the kernels vs without (float32: the two paths agree to
summation order), and a two-stage run with the kernels bit-identical to one stage with them.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)

import triton
import triton.language as tl

from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.kernels.deltanet_decode_triton import conv_step, delta_step
from stagewise.kernels.gemv_triton import TALL_OVERLAPPED_CONFIG, config_for, gemv, gemv_grid, gemv_tile
from stagewise.kernels.moe_route_triton import add_gated_shared, combine, route
from stagewise.kernels.rms_norm_triton import add_rms_norm, rms_norm
from stagewise.kernels.rope_store_triton import rope_store
from stagewise.kernels.silu_mul_triton import silu_mul
from stagewise.kernels.triton_launch import kernels_on_host, use_triton
from stagewise.models.layers.delta_rule import recurrent_gated_delta_rule
from stagewise.models.layers.gated_rms_norm import GatedRMSNorm
from stagewise.models.layers.rms_norm import RMSNorm
from stagewise.models.layers.rotary import apply_rotary, rotary_cos_sin
from tests.staged import Trace, run_trace

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {"atol": 2e-6, "rtol": 2e-6}
# half precision for exact rounding checks: the interpreter truncates to bfloat16 where GPUs round to nearest
HALF = torch.bfloat16 if DEVICE == "cuda" else torch.float16


@pytest.mark.parametrize("zero_centered", [False, True])
def test_rms_norm_matches_reference_on_strided_heads(zero_centered: bool) -> None:
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6, zero_centered).to(DEVICE)
    norm.weight.data.normal_()
    packed = torch.randn(2, 3, 4 * 64 + 16, device=DEVICE)  # q heads then 16 other columns
    heads = packed[..., : 4 * 64].reshape(2, 3, 4, 64)  # a strided view, as the fused q/k/v gives it
    torch.testing.assert_close(rms_norm(heads, norm.weight, 1e-6, zero_centered), norm.forward(heads.contiguous()), **TOL)
    rows = torch.randn(5, 64, device=DEVICE)
    torch.testing.assert_close(rms_norm(rows, norm.weight, 1e-6, zero_centered), norm.forward(rows), **TOL)


def test_gated_rms_norm_matches_reference() -> None:
    torch.manual_seed(1)
    norm = GatedRMSNorm(32, 1e-6).to(DEVICE)
    norm.weight.data.normal_()
    x, z = torch.randn(2, 4, 32, device=DEVICE), torch.randn(2, 4, 32, device=DEVICE)
    torch.testing.assert_close(rms_norm(x, norm.weight, 1e-6, gate=z), norm.forward(x, z), **TOL)


@pytest.mark.parametrize("rotary_dim", [64, 16])  # full and partial rotary
def test_rope_store_rotates_q_and_k_and_fills_the_cache(rotary_dim: int) -> None:
    torch.manual_seed(2)
    heads, kv_heads, dim = 4, 2, 64
    packed = torch.randn(2, 3, (heads + 2 * kv_heads) * dim + 8, device=DEVICE)  # a fused q/k/v output
    q, k, v = packed[..., : (heads + 2 * kv_heads) * dim].split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    q, k, v = (t.reshape(2, 3, -1, dim) for t in (q, k, v))  # (B, T, H, D) strided views
    positions = torch.arange(3, device=DEVICE)[None].repeat(2, 1) + torch.tensor([[0], [14]], device=DEVICE)  # row 1 crosses a block
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device=DEVICE).float() / rotary_dim))
    cos, sin = rotary_cos_sin(inv_freq, positions, torch.float32)
    # a paged cache of 16-position blocks; each sequence's two blocks scattered, not in order
    table = torch.tensor([[5, 2], [0, 3]], dtype=torch.int32, device=DEVICE)  # (B, blocks per row)
    keys, values = torch.zeros(6, kv_heads, 16, dim, device=DEVICE), torch.zeros(6, kv_heads, 16, dim, device=DEVICE)
    got_q = rope_store(q, k, v, inv_freq, positions, keys, values, table)
    torch.testing.assert_close(got_q, apply_rotary(q.transpose(1, 2), cos, sin).transpose(1, 2), **TOL)
    want_k = apply_rotary(k.transpose(1, 2), cos, sin)  # (B, kvH, T, D)
    written = torch.zeros(6, 16, dtype=torch.bool, device=DEVICE)
    for b in range(2):
        for t, p in enumerate(positions[b].tolist()):
            block, offset = int(table[b, p // 16]), p % 16
            torch.testing.assert_close(keys[block][:, offset], want_k[b][:, t], **TOL)
            assert torch.equal(values[block][:, offset], v[b, t])
            written[block, offset] = True
    assert not keys.permute(0, 2, 1, 3)[~written].any() and not values.permute(0, 2, 1, 3)[~written].any()


@pytest.mark.parametrize("zero_centered", [False, True], ids=["plain", "zero_centered"])
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_rope_store_with_qk_norm_equals_norms_then_rope_store(zero_centered: bool, dtype: torch.dtype) -> None:
    """The per-head q/k RMSNorm inside rope_store gives what rms_norm followed by rope_store gives (the
    float32 sum of squares may be added in another order: within one rounding of the dtype)."""
    from stagewise.kernels.rope_store_triton import QKNorm

    torch.manual_seed(9)
    heads, kv_heads, dim, rotary_dim = 4, 2, 64, 16  # partial rotary: the norm covers every channel
    packed = torch.randn(2, 3, (heads + 2 * kv_heads) * dim, device=DEVICE).to(dtype)
    q, k, v = (t.reshape(2, 3, -1, dim) for t in packed.split([heads * dim, kv_heads * dim, kv_heads * dim], -1))
    positions = torch.tensor([[0, 1, 2], [17, 18, 19]], device=DEVICE)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device=DEVICE).float() / rotary_dim))
    table = torch.tensor([[1, 0], [2, 3]], dtype=torch.int32, device=DEVICE)
    q_weight, k_weight = (torch.randn(dim, device=DEVICE).to(dtype) for _ in range(2))
    norm = QKNorm(q_weight, k_weight, 1e-6, zero_centered)
    caches = [(torch.zeros(4, kv_heads, 16, dim, device=DEVICE, dtype=dtype),
               torch.zeros(4, kv_heads, 16, dim, device=DEVICE, dtype=dtype)) for _ in range(2)]
    fused = rope_store(q, k, v, inv_freq, positions, *caches[0], table, norm)
    qn, kn = rms_norm(q, q_weight, 1e-6, zero_centered), rms_norm(k, k_weight, 1e-6, zero_centered)
    split = rope_store(qn, kn, v, inv_freq, positions, *caches[1], table)
    tol = TOL if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(fused, split, **tol)
    torch.testing.assert_close(caches[0][0], caches[1][0], **tol)
    assert torch.equal(caches[0][1], caches[1][1])  # values are stored as they are
    assert torch.equal(rope_store(q, k, v, inv_freq, positions, *caches[0], table, norm), fused)  # deterministic
    with pytest.raises(ValueError, match="channels"):
        rope_store(q, k, v, inv_freq, positions, *caches[0], table, QKNorm(q_weight[:32], k_weight, 1e-6))


def test_rope_store_angles_round_like_the_reference_tables() -> None:
    """Far positions (large angles) in half precision: the kernel's cos/sin, rounded to the activation
    dtype, rotate as the reference's half-precision tables do."""
    torch.manual_seed(3)
    heads, dim = 2, 64
    q, k, v = (torch.randn(1, 4, heads, dim, device=DEVICE).to(HALF) for _ in range(3))
    positions = torch.tensor([[5, 4_095, 70_001, 131_071]], device=DEVICE)
    inv_freq = 1.0 / (500_000 ** (torch.arange(0, dim, 2, device=DEVICE).float() / dim))
    keys = torch.zeros(2048, heads, 64, dim, dtype=HALF, device=DEVICE)  # 131,072 positions in 64-position blocks
    values = torch.zeros_like(keys)
    table = torch.arange(2048, dtype=torch.int32, device=DEVICE).flip(0)[None]  # (1, 2048), reversed
    got_q = rope_store(q, k, v, inv_freq, positions, keys, values, table)
    cos, sin = rotary_cos_sin(inv_freq, positions, HALF)  # tables rounded to the activation dtype
    want_q = apply_rotary(q.transpose(1, 2).float(), cos.float(), sin.float()).transpose(1, 2)
    torch.testing.assert_close(got_q.float(), want_q, atol=1e-2, rtol=1e-2)
    want_k = apply_rotary(k.transpose(1, 2).float(), cos.float(), sin.float())[0]  # (kvH, T, D)
    at = positions[0]
    stored = keys[table[0, at // 64].long(), :, at % 64].transpose(0, 1)  # (kvH, T, D)
    torch.testing.assert_close(stored.float(), want_k, atol=1e-2, rtol=1e-2)
    # q = 1 in the first half, 0 in the second: the kernel writes its own tables, cos then sin
    ones = torch.cat((torch.ones(dim // 2), torch.zeros(dim // 2))).to(HALF).to(DEVICE).expand(1, 4, heads, dim)
    tables = rope_store(ones, k, v, inv_freq, positions, keys, values, table)[0, :, 0]  # (T, D)
    want = torch.cat((cos[0, :, : dim // 2], sin[0, :, : dim // 2]), dim=-1)
    if DEVICE == "cuda":  # the same values as torch's CUDA tables: bit-identical
        assert torch.equal(tables, want)
    else:  # numpy's cos in the interpreter against torch's: within one rounding of the half dtype
        torch.testing.assert_close(tables, want, atol=1e-3, rtol=1e-3)


def test_silu_mul_matches_reference() -> None:
    gate_up = torch.randn(5, 2 * 48, device=DEVICE)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(gate_up), torch.nn.functional.silu(gate) * up, **TOL)


def test_deltanet_decode_step_matches_reference() -> None:
    torch.manual_seed(3)
    batch, k_heads, v_heads, dk, dv, kernel = 2, 2, 4, 16, 8, 4
    channels = 2 * k_heads * dk + v_heads * dv
    conv_pool = torch.randn(2 * batch, channels, kernel, device=DEVICE)  # rows' published windows, then new ones
    conv_state, new_conv = conv_pool[:batch], conv_pool[batch:]
    x = torch.randn(batch, channels, device=DEVICE)
    weight = torch.randn(channels, 1, kernel, device=DEVICE)
    mixed = conv_step(x, weight, conv_pool, 0, batch)
    window = torch.cat([conv_state, x[..., None]], dim=-1)
    torch.testing.assert_close(new_conv, window[..., 1:], atol=0, rtol=0)
    want_mixed = torch.nn.functional.silu(torch.nn.functional.conv1d(window[..., 1:], weight, groups=channels))[..., 0]
    torch.testing.assert_close(mixed, want_mixed, **TOL)

    b, a = torch.randn(batch, v_heads, device=DEVICE), torch.randn(batch, v_heads, device=DEVICE)
    a_log, dt_bias = torch.randn(v_heads, device=DEVICE), torch.randn(v_heads, device=DEVICE)
    pool = torch.randn(2 * batch, v_heads, dk, dv, device=DEVICE)
    state, new_state = pool[:batch], pool[batch:]
    out = delta_step(mixed, b, a, a_log, dt_bias, pool, 0, batch, k_heads, dk)
    q, k, v = torch.split(mixed, [k_heads * dk, k_heads * dk, v_heads * dv], dim=-1)
    g = -a_log.exp() * torch.nn.functional.softplus(a + dt_bias)
    want_out, want_state = recurrent_gated_delta_rule(
        q.reshape(batch, 1, k_heads, dk), k.reshape(batch, 1, k_heads, dk), v.reshape(batch, 1, v_heads, dv),
        g[:, None], b.sigmoid()[:, None], state)
    torch.testing.assert_close(out, want_out[:, 0], **TOL)
    torch.testing.assert_close(new_state, want_state, **TOL)


def test_kernels_only_on_request_off_gpu() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the host path needs the interpreter")
    cpu = torch.zeros(1)
    assert not use_triton(cpu)
    with kernels_on_host():
        assert use_triton(cpu)
    assert not use_triton(cpu)


def _trace(preset: str, fused: bool, monkeypatch: pytest.MonkeyPatch, devices: str = "", placement: str = "single",
           dtype: str = "float32", chunk: int = 4, decode_steps: int = 6) -> Trace:
    """Prefill + decode of a tiny random model with or without the Triton kernels: on the GPU when
    there is one (switched by STAGEWISE_KERNELS), else on the CPU through the interpreter."""
    prompt = [3, 17, 5, 9, 22, 8, 1, 4, 30, 2]
    monkeypatch.setenv("STAGEWISE_KERNELS", "triton" if fused else "torch")
    devices = devices or ("cuda:0" if DEVICE == "cuda" else "cpu:1x1GiB")
    loaded = load_model(f"random:{preset}", devices=devices, placement=placement, context=64, dtype=dtype)
    try:
        with kernels_on_host():
            trace = run_trace(loaded.pipeline, prompt, chunk=chunk, decode_steps=decode_steps)
    finally:
        loaded.close()
    return Trace([t.cpu() for t in trace.logits], [t.cpu() for t in trace.features], trace.tokens,
                 {k: v.cpu() for k, v in trace.states.items()})


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3.5", "tiny-qwen3.6",
                                    "tiny-qwen3.6@q8_0"])
def test_model_with_kernels_matches_reference_path(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reference, fused_trace = (_trace(preset, fused, monkeypatch) for fused in (False, True))
    assert fused_trace.tokens == reference.tokens
    for got, want in zip(fused_trace.logits, reference.logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for name, want in reference.states.items():
        torch.testing.assert_close(fused_trace.states[name], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe"])
def test_packed_step_with_kernels_matches_reference_path(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A packed step (a decoding row beside two prompts' chunks) through rope_store + decode_attention
    + SDPA per chunk gives the reference path's logits and KV."""
    results = []
    for fused in (False, True):
        monkeypatch.setenv("STAGEWISE_KERNELS", "triton" if fused else "torch")
        devices = "cuda:0" if DEVICE == "cuda" else "cpu:1x1GiB"
        loaded = load_model(f"random:{preset}", devices=devices, placement="single", context=64, dtype="float32",
                            max_seqs=4)
        results.append(_packed_step_result(loaded))
    (want, want_kv), (got, got_kv) = results
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for key, tensor in want_kv.items():
        torch.testing.assert_close(got_kv[key], tensor, atol=1e-5, rtol=1e-5)


def _packed_step_result(loaded: LoadedModel) -> tuple[torch.Tensor, dict[tuple[int, str], torch.Tensor]]:
    """One packed step of ``loaded`` (closed afterwards): its logits and every stage's KV state, on the host."""
    from tests.test_packed_steps import LAYOUT, prepare_packed

    try:
        with kernels_on_host():
            tokens, positions, _ = prepare_packed(loaded.pipeline, loaded.config.vocab_size)
            logits = loaded.pipeline.step(tokens, positions, layout=LAYOUT).logits
        assert logits is not None
        kv = {(i, n): t.cpu() for stage in loaded.pipeline.stages for i, state in stage.states.items()
              for n, t in state.tensors().items()}
        return logits.cpu(), kv
    finally:
        loaded.close()


def _two_stage_pairs() -> tuple[tuple[str, str], tuple[str, str]]:
    if DEVICE == "cuda":
        if torch.cuda.device_count() < 2:
            pytest.skip("needs two GPUs")
        return ("cuda:0", "single"), ("cuda:0,cuda:1", "pipeline:2")
    return ("cpu:1x1GiB", "single"), ("cpu:2x1GiB", "pipeline:2")


def test_packed_step_with_kernels_two_stages_bit_identical_to_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """One packed step (a decoding row beside two prompts' chunks) with the kernels: two stages give one
    stage's logits and KV exactly."""
    monkeypatch.setenv("STAGEWISE_KERNELS", "triton")
    results = []
    for devices, placement in _two_stage_pairs():
        loaded = load_model("random:tiny-llama", devices=devices, placement=placement, context=64,
                            dtype="bfloat16" if DEVICE == "cuda" else "float32", max_seqs=4)  # the interpreter's bf16 is slow
        results.append(_packed_step_result(loaded))
    (one, one_kv), (two, two_kv) = results
    assert torch.equal(one, two)
    assert one_kv.keys() == two_kv.keys() and all(torch.equal(one_kv[k], two_kv[k]) for k in one_kv)


@pytest.mark.skipif(DEVICE != "cuda", reason="a whole batch through Triton's interpreter takes minutes")
def test_packed_batch_with_kernels_two_stages_bit_identical_to_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests arriving apart through the batcher's packed steps (prompts beside decoding rows) with the
    kernels: two stages give one stage's tokens and log-probabilities exactly."""
    from stagewise.engine.batcher import Batcher
    from stagewise.engine.generation_request import GenerationRequest
    from stagewise.engine.sampling import SamplingParams
    from tests.batch_runs import run_batch

    pairs = _two_stage_pairs()
    monkeypatch.setenv("STAGEWISE_KERNELS", "triton")
    greedy = SamplingParams(temperature=0.0)
    requests = [GenerationRequest(tuple(range(3, 3 + n)), m, greedy) for n, m in ((5, 4), (11, 2), (7, 3))]
    runs = []
    for devices, placement in pairs:
        loaded = load_model("random:tiny-llama", devices=devices, placement=placement, context=64, dtype="bfloat16",
                            max_seqs=4, prefill_chunk=8)
        try:
            batcher = Batcher(loaded.pipeline, loaded.max_context, 8, micro_batches=2)
            assert batcher.packed
            with kernels_on_host():
                runs.append(run_batch(batcher, requests)[0])
        finally:
            loaded.close()
    assert runs[0] == runs[1] and [len(r) for r in runs[0]] == [4, 2, 3]


def test_two_stages_with_kernels_bit_identical_to_one(monkeypatch: pytest.MonkeyPatch) -> None:
    if DEVICE == "cuda":
        if torch.cuda.device_count() < 2:
            pytest.skip("needs two GPUs")
        pairs = (("cuda:0", "single"), ("cuda:0,cuda:1", "pipeline:2"))
    else:
        pairs = (("cpu:1x1GiB", "single"), ("cpu:2x1GiB", "pipeline:2"))
    # two prefill chunks and three decode steps: bf16 decode runs the dense GEMV a program per output column,
    # minutes through the interpreter for the whole trace
    one, two = (_trace("tiny-qwen3.6", True, monkeypatch, d, p, dtype="bfloat16", chunk=5, decode_steps=3)
                for d, p in pairs)
    assert one.tokens == two.tokens
    assert all(torch.equal(a, b) for a, b in zip(one.logits, two.logits, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(one.features, two.features, strict=True))
    assert one.states.keys() == two.states.keys()
    assert all(torch.equal(one.states[k], two.states[k]) for k in one.states)


def test_add_rms_norm_matches_add_then_norm() -> None:
    torch.manual_seed(4)
    norm = RMSNorm(64, 1e-6).to(DEVICE)
    norm.weight.data.normal_()
    x, r = torch.randn(3, 2, 64, device=DEVICE), torch.randn(3, 2, 64, device=DEVICE)
    total, normed = add_rms_norm(x, r, norm.weight, 1e-6)
    torch.testing.assert_close(total, x + r, atol=0, rtol=0)
    torch.testing.assert_close(normed, norm.forward(x + r), **TOL)


def test_gemv_dense_and_gathered() -> None:
    torch.manual_seed(5)
    w = torch.randn(40, 96, device=DEVICE)
    x = torch.randn(2, 96, device=DEVICE)
    small = (8, 32, 4, 3)  # interpreter-sized tiles; K = 96 is not a multiple of 64 below
    torch.testing.assert_close(gemv(x, w, config=small), x @ w.T, **TOL)
    torch.testing.assert_close(gemv(x, w, config=(8, 64, 4, 3)), x @ w.T, **TOL)
    torch.testing.assert_close(gemv(x, w, config=TALL_OVERLAPPED_CONFIG), x @ w.T, **TOL)  # one K step, masked
    stack = torch.randn(5, 40, 96, device=DEVICE)
    index = torch.tensor([3, 1, 4, 0], device=DEVICE)  # token 0 -> experts 3, 1; token 1 -> 4, 0
    want = torch.stack([stack[3] @ x[0], stack[1] @ x[0], stack[4] @ x[1], stack[0] @ x[1]])
    torch.testing.assert_close(gemv(x, stack, index, config=small, x_repeat=2), want, **TOL)


@triton.jit
def _gemv_tile_probe(out_ptr, N, BLOCK_N: tl.constexpr):  # type: ignore[no-untyped-def]
    m, _, _, offs_n, _ = gemv_tile(out_ptr, N, 1, False, BLOCK_N)
    pid = tl.program_id(0)
    tl.store(out_ptr + 2 * pid, m)
    tl.store(out_ptr + 2 * pid + 1, tl.min(offs_n, axis=0) // BLOCK_N)


def test_gemv_programs_run_rows_fastest() -> None:
    # consecutive programs are the rows of one column tile (they read one weight tile together, so a
    # step of several rows reads the matrix from memory once); every (row, tile) exactly once
    rows, n, block_n = 3, 40, 8  # 5 tiles
    grid = gemv_grid(n, block_n, rows)
    assert grid == (15,)
    out = torch.full((2 * grid[0],), -1, dtype=torch.int32, device=DEVICE)
    _gemv_tile_probe[grid](out, n, BLOCK_N=block_n)
    pairs = out.view(-1, 2).cpu().tolist()
    assert pairs == [[p % rows, p // rows] for p in range(grid[0])]


def test_gemv_rows_are_computed_as_each_row_alone() -> None:
    from stagewise.kernels.q8_0_gemv_triton import q8_0_gemv

    torch.manual_seed(6)
    w = torch.randn(44, 96, device=DEVICE)  # 44 outputs: the last 8-column tile is partial
    x = torch.randn(5, 96, device=DEVICE)
    small = (8, 32, 4, 3)
    together = gemv(x, w, config=small)
    assert torch.equal(together, torch.cat([gemv(x[i : i + 1], w, config=small) for i in range(5)]))
    qs = torch.randint(-127, 128, (44, 96), dtype=torch.int8, device=DEVICE)
    scales = (torch.rand(44, 3, device=DEVICE) / 64).half()
    config = (4, 64, 4, 3)
    together = q8_0_gemv(x, qs, scales, config=config)
    assert torch.equal(together, torch.cat([q8_0_gemv(x[i : i + 1], qs, scales, config=config) for i in range(5)]))


def test_gemv_takes_tall_matrices_only_when_launches_overlap() -> None:
    assert config_for(6144, 4096) is None  # q/k/v: cuBLAS, unless our kernels launch dependently
    assert config_for(6144, 4096, overlapped=True) == TALL_OVERLAPPED_CONFIG
    assert config_for(4096, 14336) == config_for(4096, 14336, overlapped=True)  # down: ours either way


def test_gemv_residual_epilogue_rounds_like_a_separate_add() -> None:
    torch.manual_seed(15)
    w = torch.randn(40, 96, device=DEVICE, dtype=HALF)
    x = torch.randn(1, 1, 96, device=DEVICE, dtype=HALF)
    r = torch.randn(1, 1, 40, device=DEVICE, dtype=HALF) * 300  # large enough that rounding twice shows
    small = (8, 32, 4, 3)
    assert torch.equal(gemv(x, w, config=small, residual=r), gemv(x, w, config=small) + r)
    with pytest.raises(ValueError, match="residual"):
        gemv(x, w, config=small, residual=r[..., :20])


def _paged(dense: torch.Tensor, table: torch.Tensor, block_tokens: int) -> torch.Tensor:
    """``dense`` ``(B, kvH, L, D)`` stored in the blocks ``table`` ``(B, L / block_tokens)`` names (+ noise elsewhere)."""
    batch, kv_heads, length, dim = dense.shape
    pool = torch.randn(int(table.max()) + 2, kv_heads, block_tokens, dim, device=dense.device)
    blocks = dense.reshape(batch, kv_heads, length // block_tokens, block_tokens, dim).transpose(1, 2)
    pool[table.long()] = blocks  # (B, nb, kvH, bt, D)
    return pool


@pytest.mark.parametrize("block_tokens", [64, 16])
@pytest.mark.parametrize("groups", [1, 4])
def test_decode_attention_matches_masked_sdpa(groups: int, block_tokens: int) -> None:
    from stagewise.kernels.decode_attention_triton import decode_attention

    torch.manual_seed(9)
    batch, kv_heads, dim, max_len, bucket = 2, 2, 32, 320, 256
    heads = kv_heads * groups
    dense_keys = torch.randn(batch, kv_heads, max_len, dim, device=DEVICE)
    dense_values = torch.randn_like(dense_keys)
    per_row = max_len // block_tokens
    gen = torch.Generator().manual_seed(1)
    table = torch.randperm(batch * per_row + 3, generator=gen)[: batch * per_row].view(batch, per_row)
    table = table.to(torch.int32).to(DEVICE)  # scattered blocks, some ids unused
    keys, values = _paged(dense_keys, table, block_tokens), _paged(dense_values, table, block_tokens)
    positions = torch.tensor([[3], [200]], device=DEVICE)  # 1 and 4 of the rows' 64-key ranges hold keys
    q = torch.randn(batch, 1, heads, dim, device=DEVICE)
    gate = torch.randn(batch, 1, heads, 2 * dim, device=DEVICE)[..., dim:]  # strided, as chunk() leaves it
    mask = (torch.arange(bucket, device=DEVICE)[None, :] <= positions)[:, None, None, :]  # (B, 1, 1, L)
    rows = q.transpose(1, 2).reshape(batch, kv_heads, groups, dim)
    want = torch.nn.functional.scaled_dot_product_attention(rows, dense_keys[:, :, :bucket],
                                                            dense_values[:, :, :bucket], attn_mask=mask)
    want = want.reshape(batch, 1, heads * dim)
    torch.testing.assert_close(decode_attention(q, keys, values, table, positions), want, **TOL)
    gated = want * torch.sigmoid(gate.reshape(batch, 1, heads * dim))
    torch.testing.assert_close(decode_attention(q, keys, values, table, positions, gate), gated, **TOL)


@pytest.mark.parametrize("block_tokens", [64, 16])
@pytest.mark.parametrize("groups", [1, 3, 4])
def test_prefill_attention_matches_masked_sdpa_per_chunk(groups: int, block_tokens: int) -> None:
    """Three prompt chunks of three rows (starting at 0, mid-block and past a block, one longer than a
    program's tokens) in one launch, against SDPA with a causal mask over each row's dense keys; tokens
    outside every chunk (a decoding row's place) are left as they were."""
    from stagewise.kernels.prefill_attention_triton import prefill_attention

    torch.manual_seed(12)
    batch, kv_heads, dim, max_len = 3, 2, 32, 320
    heads = kv_heads * groups
    dense_keys = torch.randn(batch, kv_heads, max_len, dim, device=DEVICE)
    dense_values = torch.randn_like(dense_keys)
    per_row = max_len // block_tokens
    gen = torch.Generator().manual_seed(2)
    table = torch.randperm(batch * per_row + 5, generator=gen)[: batch * per_row].view(batch, per_row)
    table = table.to(torch.int32).to(DEVICE)
    keys, values = _paged(dense_keys, table, block_tokens), _paged(dense_values, table, block_tokens)
    chunks = [(2, 0, 70), (0, 37, 5), (1, 130, 40)]  # (row, start, tokens); one token of room first
    total = 1 + sum(n for _, _, n in chunks)
    q = torch.randn(total, heads, dim, device=DEVICE)
    positions = torch.zeros(total, dtype=torch.long, device=DEVICE)
    offsets, at = [1], 1
    for _, start, n in chunks:
        positions[at : at + n] = torch.arange(start, start + n, device=DEVICE)
        at += n
        offsets.append(at)
    segments = torch.tensor(offsets, dtype=torch.int32, device=DEVICE)
    rows = torch.tensor([r for r, _, _ in chunks], dtype=torch.int32, device=DEVICE)
    out = torch.full_like(q, 7.0)
    prefill_attention(q, keys, values, table, positions, segments, rows, 70, out=out)
    assert torch.equal(out[0], torch.full_like(out[0], 7.0))
    for (row, start, n), lo in zip(chunks, offsets, strict=False):
        length = start + n
        seg = q[lo : lo + n].transpose(0, 1).reshape(kv_heads, groups * n, dim)[None]  # (1, kvH, G*n, D)
        pos = positions[lo : lo + n].repeat(groups)  # group-major rows
        mask = (torch.arange(length, device=DEVICE)[None, :] <= pos[:, None])[None, None]
        want = torch.nn.functional.scaled_dot_product_attention(
            seg, dense_keys[row : row + 1, :, :length], dense_values[row : row + 1, :, :length], attn_mask=mask)
        want = want.reshape(heads, n, dim).transpose(0, 1)  # (n, H, D)
        torch.testing.assert_close(out[lo : lo + n], want, **TOL)


def test_prefill_attention_is_independent_of_the_chunking() -> None:
    """A token's result does not depend on which chunk (or program) it lands in: the prompt attended
    as one chunk and as two (split mid-block) gives bit-identical outputs on the GPU, as the prefix cache
    needs. Triton's interpreter multiplies a program's tile by numpy's BLAS, whose float32 kernels may
    round a row differently at another row of the tile (OpenBLAS 0.3.31: 1 ulp), so there the outputs
    agree to that rounding: a key block past a token's position that added anything would show."""
    from stagewise.kernels.prefill_attention_triton import prefill_attention

    torch.manual_seed(13)
    kv_heads, groups, dim, length, block = 2, 4, 32, 192, 64
    pool_k = torch.randn(length // block + 1, kv_heads, block, dim, device=DEVICE)
    pool_v = torch.randn_like(pool_k)
    table = torch.arange(length // block, dtype=torch.int32, device=DEVICE)[None]
    q = torch.randn(length, kv_heads * groups, dim, device=DEVICE)
    positions = torch.arange(length, device=DEVICE)
    row = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    whole = prefill_attention(q, pool_k, pool_v, table, positions,
                              torch.tensor([0, length], dtype=torch.int32, device=DEVICE), row, length)
    split = torch.empty_like(q)
    for lo, hi in ((0, 100), (100, length)):
        prefill_attention(q[lo:hi], pool_k, pool_v, table, positions[lo:hi],
                          torch.tensor([0, hi - lo], dtype=torch.int32, device=DEVICE), row, hi - lo, out=split[lo:hi])
    if DEVICE == "cuda":
        assert torch.equal(whole, split)
    else:
        torch.testing.assert_close(split, whole, atol=1e-6, rtol=0)


def test_prefill_attention_gates_in_its_launch() -> None:
    """With an output gate (strided, as the fused q/gate projection gives it) each stored output is the
    ungated output rounded, times sigmoid(gate): what the decode kernel computes for a decoding row."""
    from stagewise.kernels.prefill_attention_triton import prefill_attention

    torch.manual_seed(14)
    kv_heads, groups, dim, length, block = 2, 2, 32, 80, 64
    heads = kv_heads * groups
    pool_k = torch.randn(length // block + 2, kv_heads, block, dim, device=DEVICE)
    pool_v = torch.randn_like(pool_k)
    table = torch.arange(length // block + 1, dtype=torch.int32, device=DEVICE)[None]
    q_and_gate = torch.randn(length, heads, 2 * dim, device=DEVICE, dtype=HALF)
    q, gate = q_and_gate[..., :dim], q_and_gate[..., dim:]  # the gate's token and head strides are 2x
    positions = torch.arange(length, device=DEVICE)
    segments = torch.tensor([0, length], dtype=torch.int32, device=DEVICE)
    row = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    plain = prefill_attention(q, pool_k.to(HALF), pool_v.to(HALF), table, positions, segments, row, length)
    gated = prefill_attention(q, pool_k.to(HALF), pool_v.to(HALF), table, positions, segments, row, length, gate=gate)
    want = (plain.float() * torch.sigmoid(gate.float())).to(HALF)
    torch.testing.assert_close(gated, want)  # to one rounding: sigmoid is computed apart


def test_greedy_sample_matches_argmax_and_log_softmax() -> None:
    from stagewise.kernels.greedy_sample_triton import greedy_sample

    torch.manual_seed(10)
    logits = torch.randn(10_000, device=DEVICE)  # three slices, the last one partial
    logits[9_000] = logits[4_100] = logits.max() + 1.0  # a tie across slices: the first index wins
    logits[:50] = float("-inf")
    token, logprob = greedy_sample(logits).tolist()
    assert int(token) == int(torch.argmax(logits)) == 4_100
    assert logprob == pytest.approx(float(torch.log_softmax(logits, dim=-1)[4_100]), abs=1e-6)
    slot = torch.zeros(1, 1, dtype=torch.long, device=DEVICE)  # the next step's input
    greedy_sample(logits, token_out=slot)
    assert int(slot) == 4_100
    logits[7] = float("nan")
    assert greedy_sample(logits).isnan()[1]


def test_greedy_pairs_of_a_batch_in_two_launches_match_torch() -> None:
    """``greedy_pairs`` on the Triton path (``greedy_sample_rows``) gives torch's tokens (first maximum) and
    log-probabilities, row by row, for float32 and bf16 logits and a strided batch."""
    from stagewise.kernels.greedy_sample_triton import greedy_sample_rows
    from stagewise.runtime.greedy_pairs import greedy_pairs

    torch.manual_seed(12)
    logits = torch.randn(5, 10_000, device=DEVICE)
    logits[1, 9_000] = logits[1, 4_100] = logits[1].max() + 1.0  # a tie across slices: the first index wins
    logits[2, :50] = float("-inf")
    for batch in (logits, logits.to(HALF), torch.cat([logits, logits], dim=-1)[:, :10_000]):
        want_tokens = torch.argmax(batch.float(), dim=-1)
        want_logprobs = torch.log_softmax(batch.float(), dim=-1).gather(-1, want_tokens[:, None])[:, 0]
        with kernels_on_host():
            tokens, pairs = greedy_sample_rows(batch)
            routed = greedy_pairs(batch)  # takes the kernel on this path
        assert torch.equal(routed[0], tokens) and torch.equal(routed[1], pairs)
        assert tokens.dtype == torch.long and tokens.shape == (5, 1) and pairs.shape == (5, 2)
        assert torch.equal(tokens[:, 0], want_tokens) and int(tokens[1]) == 4_100
        assert torch.equal(pairs[:, 0].long(), want_tokens)
        torch.testing.assert_close(pairs[:, 1], want_logprobs, atol=1e-5, rtol=1e-5)
    tokens, pairs = greedy_sample_rows(logits[:0])
    assert tokens.shape == (0, 1) and pairs.shape == (0, 2)


def test_peer_copy_kernel_copies_exactly() -> None:
    from stagewise.kernels.peer_copy_triton import peer_copy

    src = torch.randn(3, 1, 2500, device=DEVICE).to(HALF)  # four programs, the last partial
    dst = torch.zeros_like(src)
    peer_copy(src, dst)
    assert torch.equal(src, dst)
    with pytest.raises(ValueError):
        peer_copy(src, dst.float())


def test_route_and_combine_match_reference() -> None:
    torch.manual_seed(6)
    logits = torch.randn(5, 12, device=DEVICE)
    for normalize in (False, True):
        index, weight = route(logits, 4, normalize)
        probs = torch.softmax(logits, dim=-1)
        want_w, want_i = torch.topk(probs, 4, dim=-1)
        if normalize:
            want_w = want_w / want_w.sum(dim=-1, keepdim=True)
        assert torch.equal(index.long(), want_i)
        torch.testing.assert_close(weight, want_w, **TOL)
    y = torch.randn(5 * 4, 16, device=DEVICE)
    torch.testing.assert_close(combine(y, weight, torch.float32), (y.view(5, 4, 16) * weight[..., None]).sum(1), **TOL)
    out, shared, gate = torch.randn(5, 16, device=DEVICE), torch.randn(5, 16, device=DEVICE), torch.randn(5, 1, device=DEVICE)
    torch.testing.assert_close(add_gated_shared(out, shared, gate), out + torch.sigmoid(gate) * shared, **TOL)
    # the block's residual, added by the same launch with the rounding of a separate add (bf16)
    y, weight, r = y.to(HALF), weight.to(HALF), torch.randn(5, 16, device=DEVICE, dtype=HALF) * 300
    assert torch.equal(combine(y, weight, HALF, r), combine(y, weight, HALF) + r)
    out, shared, gate = out.to(HALF), shared.to(HALF), gate.to(HALF)
    assert torch.equal(add_gated_shared(out, shared, gate, r), add_gated_shared(out, shared, gate) + r)
    # a shared expert added by the combine's launch: the two launches' roundings, bit for bit; its gate logit
    # may be a column of the router's output (a view with the router's row stride)
    router = torch.randn(5, 13, device=DEVICE, dtype=HALF)
    for g in (gate, router[:, 12:]):
        for res in (None, r):
            want = add_gated_shared(combine(y, weight, HALF), shared, g, res)
            assert torch.equal(combine(y, weight, HALF, res, (shared, g)), want)
    with pytest.raises(ValueError, match="shared expert"):
        combine(y, weight, HALF, None, (shared[:4], gate[:4]))


def test_q8_0_gemm_matches_dequantized_matmul() -> None:
    from stagewise.kernels.q8_0_gemm import q8_0_gemm
    from stagewise.weights.quant.q8_0 import Q8_0Weight

    torch.manual_seed(7)
    qs = torch.randint(-127, 128, (48, 96), dtype=torch.int8, device=DEVICE)
    scales = (torch.rand(48, 3, device=DEVICE) * 0.01).to(torch.float16)
    weight = Q8_0Weight(qs, scales)
    x = torch.randn(2, 37, 96, device=DEVICE)  # 74 rows: several blocks and a ragged last one
    want = x @ weight.dequantize(torch.float32).T
    torch.testing.assert_close(q8_0_gemm(x, qs, scales), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k", [96, 128])  # a ragged last K step, and K steps that divide evenly
def test_q8_0_gemv_dense_and_gathered(k: int) -> None:
    from stagewise.kernels.q8_0_gemv_triton import q8_0_gemv

    torch.manual_seed(8)
    qs = torch.randint(-127, 128, (3, 40, k), dtype=torch.int8, device=DEVICE)  # 3 experts
    scales = (torch.rand(3, 40, k // 32, device=DEVICE) * 0.01).to(torch.float16)
    dense = [(qs[e].float().view(40, -1, 32) * scales[e].float()[..., None]).view(40, k) for e in range(3)]
    x = torch.randn(2, k, device=DEVICE)
    config = (4, 64, 2, 2)  # several K steps: the first tile is read before the wait, the rest in the loop
    torch.testing.assert_close(q8_0_gemv(x, qs[1], scales[1], config=config), x @ dense[1].T, atol=1e-4, rtol=1e-4)
    index = torch.tensor([2, 0, 1, 1], device=DEVICE)  # two routed experts per token
    want = torch.stack([dense[int(e)] @ x[i // 2] for i, e in enumerate(index)])
    torch.testing.assert_close(q8_0_gemv(x, qs, scales, index, config=config, x_repeat=2), want, atol=1e-4, rtol=1e-4)
