"""Kernels A and B (packed few-rows GEMM on the planes) against dequantize-then-matmul, every packed type.

Kernel A (scales after a dot per group) for 1-16 rows and MoE expert blocks, kernel B (values rounded
once, then dotted) for 17-128 rows; both against ``x @ dequantize(W).T`` in float32 (Triton's
interpreter on CPU runs their float32 form; a GPU runs the bf16 forms, checked at bf16 tolerance),
with K not a multiple of the tiles, partial row and weight tiles, split K, the fused SiLU·up and the
routing weight; and the dispatch of ``PackedWeight.matmul`` pinned by row count.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from gguf.constants import GGMLQuantizationType

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from stagewise.kernels import packed_matmul
from stagewise.kernels.moe_align import identity_alignment, moe_align
from stagewise.kernels.packed_decode_triton import PackedTiles, packed_decode_gemm, packed_decode_gemm_glu
from stagewise.kernels.silu_mul_triton import silu_mul
from stagewise.weights.quant.packed_weight import PackedWeight, matmul_path
from tests.test_packed_kernels import DEVICE, _on_device, _random_rows

T = GGMLQuantizationType
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4]
TOL = 2e-5  # of max |y|, float32 activations: summation order and the scales' reordering only


def _weight(qtype: GGMLQuantizationType, lead: tuple[int, ...], k: int, seed: int) -> PackedWeight:
    n = 1
    for d in lead:
        n *= d
    raw = _random_rows(qtype, n, k, seed).reshape(*lead, -1)
    return PackedWeight.from_rows(_on_device(raw), qtype, k)


def _close(got: torch.Tensor, ref: torch.Tensor, tol: float = TOL) -> None:
    scale = ref.abs().max().item()
    err = (got.float().cpu() - ref).abs().max().item()
    assert scale > 0 and err <= tol * scale, f"max error {err:.3g} > {tol:g} x {scale:.3g}"


def _small(scale_after: bool, split: int = 1) -> PackedTiles:
    return PackedTiles(block_n=16, num_warps=4, num_stages=1, scale_after=scale_after, blocks=2, split_k=split)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "scale_after"), [(1, True), (5, True), (5, False), (17, False), (40, False)],
                         ids=["A1", "A5", "B5", "B17", "B40"])
def test_kernels_match_dequantized_matmul(qtype: GGMLQuantizationType, rows: int, scale_after: bool) -> None:
    k = 256 * 3 if qtype in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS) else 32 * 5  # K steps: 3 / 2.5
    w = _weight(qtype, (1, 20), k, seed=int(qtype))  # 20 weight rows: a partial 16-row tile
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    ref = x @ w.dequantize().cpu()[0].T
    blocks = 1 if k % 64 else 2  # 5 blocks: one-block steps
    tiles = PackedTiles(block_n=16, num_warps=4, num_stages=1, scale_after=scale_after, blocks=blocks)
    block_m = max(16, 1 << (rows - 1).bit_length())
    got = packed_decode_gemm(x.to(DEVICE), w, identity_alignment(rows, block_m, x.to(DEVICE).device), 1, tiles,
                             gather_rows=False)
    assert got.shape == (rows, 20)
    _close(got, ref)


@pytest.mark.parametrize("rows", [1, 16, 17, 128])
def test_matmul_takes_the_kernel_of_its_row_count(rows: int) -> None:
    k = 256
    w = _weight(T.Q4_K, (24,), k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(0))
    ref = x @ w.dequantize().cpu().T
    from stagewise.kernels.triton_launch import kernels_on_host

    with kernels_on_host():
        _close(w.matmul(x.to(DEVICE)), ref)


@pytest.mark.parametrize("qtype, k", [(T.Q3_K, 512), (T.Q4_K, 512), (T.Q6_K, 512), (T.IQ4_XS, 256)],
                         ids=["Q3_K", "Q4_K", "Q6_K", "IQ4_XS"])
def test_one_bf16_row_takes_the_word_gemv_through_the_weight(qtype: GGMLQuantizationType, k: int) -> None:
    """A packed weight's one-row matmul and its gathered experts (MoE decode) reach the word GEMV with bf16 input
    (K 256 / 512: several sets of rows a warp) and match the dequantized weight to a bf16 rounding; an expert's
    view may start 8 bytes past a 16-byte boundary (expert 1 of IQ4_XS: 8 meta bytes a row, 21 rows)."""
    from stagewise.kernels.triton_launch import kernels_on_host

    w = _weight(qtype, (3, 21), k, seed=int(qtype))  # 3 experts of 21 rows
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(1)).bfloat16()
    dense = w.dequantize().cpu()
    assert matmul_path(1, qtype, k, torch.bfloat16) == "gemv"
    with kernels_on_host():
        _close(w.expert(1).matmul(x.to(DEVICE)), x.float() @ dense[1].T, 1e-2)
        index = torch.tensor([2, 0, 2]).to(DEVICE)
        ref = torch.stack([dense[e] @ x[0].float() for e in (2, 0, 2)])
        _close(w.gather_matmul(index, x.to(DEVICE), x_repeat=3), ref, 1e-2)


def test_the_dispatch_by_rows_is_pinned() -> None:
    def paths(qtype: GGMLQuantizationType, rows: tuple[int, ...], k: int = 4096, dtype: torch.dtype = torch.bfloat16
              ) -> list[str]:
        return [matmul_path(r, qtype, k, dtype) for r in rows]

    assert paths(T.Q6_K, (1, 16, 17, 64, 128, 129, 4096)) == ["gemv", "A", "B", "B", "B", "tiles", "tiles"]
    assert paths(T.Q6_K, (1,), k=3072) == paths(T.Q6_K, (1,), dtype=torch.float16) == ["A"]  # no word GEMV there
    assert paths(T.Q4_K, (1, 2, 16, 17)) == ["gemv", "B", "B", "B"]  # one Q4_K row: the GEMV (words or slots)
    assert paths(T.Q4_K, (1,), k=3072) == ["gemv"]
    assert paths(T.IQ4_XS, (1, 2)) == paths(T.Q3_K, (1, 2)) == ["gemv", "A"]
    assert paths(T.IQ4_NL, (1, 2)) == ["A", "A"]
    dense_tiles = packed_matmul.dense_tiles
    cpu = torch.device("cpu")  # the kernel the matmul launches agrees: kernel B from one row for Q4_K only
    assert [dense_tiles(r, 4096, 4096, q, cpu)[1].scale_after for q in (T.Q4_K, T.Q6_K) for r in (1, 8, 17)] == [
        False, False, False, True, True, False]
    cuda = torch.device("cuda")  # the tiles are a function of the device kind and the shape (no device needed)

    def tiles(rows: int, n: int, k: int, qtype: GGMLQuantizationType) -> tuple[int, int, int, bool, int]:
        t = dense_tiles(rows, n, k, qtype, cuda)[1]
        return t.block_n, t.num_warps, t.num_stages, t.scale_after, t.split_k

    # a narrow Q4_K matrix (at most 4,096 weight rows: Llama-8B's o and down) at 1-16 rows: kernel B in 32-row
    # two-warp programs, the K split as for 64-row tiles; not past 16 rows, nor for a wider matrix or another type
    assert [tiles(r, 4096, 14336, T.Q4_K) for r in (1, 16, 17)] == [(32, 2, 3, False, 8)] * 2 + [(64, 4, 2, False, 8)]
    assert tiles(8, 4096, 4096, T.Q4_K)[:2] == (32, 2) and tiles(8, 4097, 4096, T.Q4_K)[:2] == (64, 4)
    assert tiles(8, 4096, 14336, T.Q6_K) == (64, 4, 2, True, 8)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.IQ4_XS, T.Q5_0], ids=lambda t: t.name)
def test_expert_blocks_glu_split_and_route_weights(qtype: GGMLQuantizationType) -> None:
    experts, inter, hidden, tokens, top_k = 4, 16, 256, 3, 2
    gate_up = _weight(qtype, (experts, 2 * inter), hidden, seed=3)
    down = _weight(qtype, (experts, hidden), 256, seed=4)  # (E, H, K = 256): the down GEMM's shape, K = 256
    g = torch.Generator().manual_seed(5)
    x = torch.randn(tokens, hidden, generator=g)
    top_index = torch.tensor([[0, 2], [2, 3], [0, 3]])
    top_weight = torch.rand(tokens, top_k, generator=g)
    align = moe_align(top_index.to(DEVICE), experts, 16)
    wg = gate_up.dequantize().cpu()  # (E, 2I, H)
    slot_rows = [(t, int(top_index[t, j])) for t in range(tokens) for j in range(top_k)]
    ref_h = torch.stack([wg[e] @ x[t] for t, e in slot_rows])  # (S, 2I)
    for scale_after in (True, False):
        h = packed_decode_gemm(x.to(DEVICE), gate_up, align, top_k, _small(scale_after), gather_rows=True)
        _close(h, ref_h)
        act = packed_decode_gemm_glu(x.to(DEVICE), gate_up, align, top_k, _small(scale_after), gather_rows=True)
        _close(act, silu_mul(h).cpu(), 1e-5)  # the fused SiLU·up: as silu_mul of the stored pair
        split = packed_decode_gemm_glu(x.to(DEVICE), gate_up, align, top_k, _small(scale_after, 2), gather_rows=True)
        _close(split, act.cpu(), 1e-5)
        a = torch.randn(tokens * top_k, 256, generator=g)
        wd = down.dequantize().cpu()
        y = packed_decode_gemm(a.to(DEVICE), down, align, top_k, _small(scale_after), gather_rows=False,
                               top_weight=top_weight.to(DEVICE))
        ref_y = torch.stack([top_weight.flatten()[s] * (wd[e] @ a[s]) for s, (_t, e) in enumerate(slot_rows)])
        _close(y, ref_y)


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q4_0], ids=lambda t: t.name)
def test_packed_gate_up_with_silu_mul_in_one_launch(qtype: GGMLQuantizationType, split: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused 2-D gate/up at 2-16 rows: SiLU·up in its kernel's epilogue (kernel A; kernel B for Q4_K), with the
    tiles and K split of the plain matmul over the whole weight, gives bit for bit the matmul followed by ``silu_mul``
    (K split in two as well: the interpreter's tiles split nothing of themselves); one row's GEMV, more rows and a
    weight with an odd row count have no such launch."""
    import dataclasses

    from stagewise.kernels.triton_launch import kernels_on_host

    tiles = packed_matmul.dense_tiles
    monkeypatch.setattr(packed_matmul, "dense_tiles", lambda *a: (tiles(*a)[0], dataclasses.replace(tiles(*a)[1], split_k=split)))
    k = 512 if qtype != T.Q4_0 else 256
    inter = 24  # a partial 16-row tile of gate rows, and of up rows
    w = _weight(qtype, (2 * inter,), k, seed=7)
    with kernels_on_host():
        for rows in (2, 9, 16):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).bfloat16().to(DEVICE)
            fused = w.matmul_glu(x)
            assert fused is not None and fused.shape == (rows, inter)
            assert torch.equal(fused, silu_mul(w.matmul(x)))
            _close(fused.float(), silu_mul((x.float().cpu() @ w.dequantize().cpu().T).bfloat16()).float(), 2e-2)
        assert w.matmul_glu(torch.randn(17, k).bfloat16().to(DEVICE)) is None  # past GLU_MAX_ROWS
        if qtype == T.Q4_K:
            assert w.matmul_glu(torch.randn(1, k).bfloat16().to(DEVICE)) is None  # the GEMV
        odd = _weight(qtype, (2 * inter + 1,), k, seed=8)
        with pytest.raises(ValueError, match="an even number of rows"):
            odd.matmul_glu(torch.randn(2, k).bfloat16().to(DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 8, 40])
def test_compiled_kernels_in_bf16_match_dequantized_matmul(qtype: GGMLQuantizationType, rows: int) -> None:
    """The compiled forms: bf16 activations, kernel A's magic-number conversion and kernel B's values by bf16
    arithmetic (from one row for the types in ``packed_matmul.B_FROM_ONE_ROW``), at the tiles the dispatch picks,
    within bf16 tolerance; equal inputs give equal outputs. (5,000 rows: not narrow, see the next test.)"""
    _check_compiled(qtype, rows, 5000)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("qtype", sorted(packed_matmul.NARROW_TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 8, 16])
def test_compiled_narrow_matrix_tiles(qtype: GGMLQuantizationType, rows: int) -> None:
    """A narrow matrix (at most ``NARROW_MAX_N`` weight rows) at 1-16 rows takes ``NARROW_TILES`` (two warps:
    mma.sync) and matches the dequantized matmul as the other tiles do."""
    assert packed_matmul.narrow(qtype, 1000)
    assert packed_matmul.dense_tiles(rows, 1000, 4352, qtype, torch.device("cuda"))[1].num_warps == \
        packed_matmul.NARROW_TILES[1]
    _check_compiled(qtype, rows, 1000)


def _check_compiled(qtype: GGMLQuantizationType, rows: int, n: int) -> None:
    k = 4096 + (256 if qtype in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS) else 32)  # K: not a tile multiple
    w = _weight(qtype, (n,), k, seed=int(qtype))
    x = torch.randn(rows, k, device="cuda", generator=torch.Generator("cuda").manual_seed(rows)).to(torch.bfloat16)
    ref = x.float() @ w.dequantize().T
    got = packed_matmul.packed_matmul(x, w)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    assert float((got.float() - ref).norm() / ref.norm()) <= 1e-2
    assert torch.equal(packed_matmul.packed_matmul(x, w), got)


@pytest.mark.parametrize(("preset", "fmt", "expert_b"), [("tiny-llama", "q4_k", 0), ("tiny-qwen3-moe", "q6_k", 0),
                                                        ("tiny-qwen3-moe", "q4_k", 1)])
def test_tiny_models_through_the_kernels_match_the_reference_path(preset: str, fmt: str, expert_b: int, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill chunks (8 rows: kernel A, kernel B for Q4_K; the MoE's routed tokens in one-expert blocks) and
    decode steps (one row's GEMV; one token's experts by the GEMV) of a whole packed model, against the torch path
    on the dequantized weights; Q4_K's expert blocks in kernel B too (``EXPERT_B_FROM_ONE_ROW``). The presets widened
    to 256 (a K-quant's super-block: the tiny presets' 64-wide matrices would stay float) and cut to one layer;
    the launches are counted, so a model that never reaches the kernels fails."""
    import json

    from stagewise.kernels import packed_decode_triton
    from stagewise.weights.preset_configs import load_hf_config
    from tests.test_triton_kernels import _trace

    moe = "moe" in preset
    config = load_hf_config(preset) | {"hidden_size": 256, "intermediate_size": 256, "head_dim": 64,
                                       "num_hidden_layers": 1} | ({"moe_intermediate_size": 256, "num_experts": 4}
                                                                  if moe else {})
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(packed_matmul, "EXPERT_B_FROM_ONE_ROW", expert_b)
    launched: list[tuple[bool, bool]] = []  # (kernel A, expert blocks) of each packed few-rows launch
    launch = packed_decode_triton._launch

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        launched.append((args[4].scale_after, bool(kwargs["gather_rows"])))  # type: ignore[attr-defined]
        return launch(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(packed_decode_triton, "_launch", counted)
    model = f"{tmp_path}@{fmt}"

    # 8-token prefill chunks: 16 routed slots, past the experts' GEMV (8), into one-expert blocks
    reference, fused = (_trace(model, f, monkeypatch, chunk=8, decode_steps=2) for f in (False, True))
    assert fused.tokens == reference.tokens
    for got, want in zip(fused.logits, reference.logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    kernel_a = T[fmt.upper()] not in packed_matmul.B_FROM_ONE_ROW  # else kernel B, its expert blocks with expert_b
    assert set(launched) == {(kernel_a, False)} | ({(kernel_a and not expert_b, True)} if moe else set())


def _run_ptx(text: str, inputs: dict[str, int]) -> dict[str, int]:
    """A tiny interpreter of the PTX the nibble conversions use (prmt with its sign-replicate mode, lop3, shl,
    shr, and, or, mov on b32 registers, cvt from 16 bits)."""
    regs = dict(inputs)
    mask = 0xFFFFFFFF

    def value(token: str) -> int:
        token = token.strip()
        return regs[token] if token in regs else int(token, 0)

    for line in text.replace(";", ";\n").splitlines():
        line = line.strip().rstrip(";").strip()
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = (a.strip() for a in args.split(","))
        if op == "prmt.b32":
            a, b, sel = value(src[0]), value(src[1]), value(src[2])
            pool = a | (b << 32)
            out = 0
            for i in range(4):
                nibble = (sel >> (4 * i)) & 15
                byte = (pool >> (8 * (nibble & 7))) & 0xFF
                if nibble & 8:  # replicate the selected byte's sign bit
                    byte = 0xFF if byte & 0x80 else 0
                out |= byte << (8 * i)
            regs[dst] = out
        elif op == "lop3.b32":
            a, b, c, lut = (value(t) for t in src)
            regs[dst] = sum((((lut >> ((((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1))) & 1) << i)
                            for i in range(32))
        elif op == "shl.b32":
            regs[dst] = (value(src[0]) << value(src[1])) & mask
        elif op == "shr.u32":
            regs[dst] = value(src[0]) >> value(src[1])
        elif op == "and.b32":
            regs[dst] = value(src[0]) & value(src[1])
        elif op == "or.b32":
            regs[dst] = value(src[0]) | value(src[1])
        elif op == "mov.b32":
            regs[dst] = value(src[0])
        elif op == "cvt.u32.u16":
            regs[dst] = value(src[0]) & 0xFFFF
        else:
            raise AssertionError(f"unexpected PTX {op}")
    return regs


def _bf16(bits: int) -> float:
    """The bf16 with these bits."""
    return float(torch.tensor([bits - (bits >> 15 << 16)], dtype=torch.int16).view(torch.bfloat16).float())


def test_the_nibble_ptx_makes_128_plus_each_value_in_bf16() -> None:
    """The inline PTX of kernel A's compiled path (not run by the interpreter), checked instruction by
    instruction here: element ``e`` of two packed bytes gives ``128 + (q_e & 15)`` and ``128 + (q_e >> 4)``,
    and with Q5_K's high-bit bytes the fifth bit of bits ``2c`` and ``2c + 1``."""
    from stagewise.kernels import quant_bf16_triton as kernels

    def lanes(regs: dict[str, int], out: int) -> list[int]:
        return [(regs[f"${out}"] >> (16 * i)) & 0xFFFF for i in range(2)]

    rng = torch.Generator().manual_seed(0)
    for _ in range(64):
        q = torch.randint(0, 256, (2,), generator=rng).tolist()
        h = torch.randint(0, 256, (2,), generator=rng).tolist()
        junk = int(torch.randint(0, 1 << 16, (), generator=rng)) << 16  # above the 16-bit operand: ignored
        word, high = q[0] | q[1] << 8 | junk, h[0] | h[1] << 8 | junk
        out = _run_ptx(kernels.NIBBLES_ASM.value, {"$2": word})
        assert [_bf16(v) for v in lanes(out, 0)] == [128 + (b & 15) for b in q]
        assert [_bf16(v) for v in lanes(out, 1)] == [128 + (b >> 4) for b in q]
        for c, text in enumerate((kernels.Q5K_ASM0, kernels.Q5K_ASM1, kernels.Q5K_ASM2, kernels.Q5K_ASM3)):
            out = _run_ptx(text.value, {"$2": word, "$3": high})
            assert [_bf16(v) for v in lanes(out, 0)] == [128 + (b & 15) + 16 * ((e >> (2 * c)) & 1) for b, e in zip(q, h, strict=True)]
            assert [_bf16(v) for v in lanes(out, 1)] == [128 + (b >> 4) + 16 * ((e >> (2 * c + 1)) & 1)
                                                         for b, e in zip(q, h, strict=True)]
        qh, first = int(torch.randint(0, 1 << 32, (), generator=rng)), int(torch.randint(0, 8, (), generator=rng)) * 2
        out = _run_ptx(kernels.Q5_ASM.value, {"$2": word, "$3": qh >> first, "$4": qh >> (first + 1)})  # Q5_0 / Q5_1
        assert [_bf16(v) for v in lanes(out, 0)] == [128 + (b & 15) + 16 * ((qh >> (first + e)) & 1) for e, b in enumerate(q)]
        assert [_bf16(v) for v in lanes(out, 1)] == [128 + (b >> 4) + 16 * ((qh >> (first + e + 16)) & 1)
                                                     for e, b in enumerate(q)]


def test_the_q6_k_ptx_makes_128_plus_each_six_bit_value_in_bf16() -> None:
    """Kernel A's Q6_K PTX, instruction by instruction: low bytes of rows ``r`` and ``r + 2`` and their high bytes
    give ``128 + u`` of ``(r, low nibble)``, ``(r, high)``, ``(r + 2, low)``, ``(r + 2, high)``, ``u`` the nibble and
    high field ``2h + s`` (``s`` 0 for ``r``, 1 for ``r + 2``) as gguf's Q6_K puts them together."""
    from stagewise.kernels import quant_bf16_triton as kernels

    rng = torch.Generator().manual_seed(1)
    for _ in range(256):
        lo, lo2, high = (torch.randint(0, 256, (2,), generator=rng).tolist() for _ in range(3))
        regs = {f"${4 + i}": b[0] | b[1] << 8 | int(torch.randint(0, 1 << 16, (), generator=rng)) << 16
                for i, b in enumerate((lo, lo2, high))}  # bits above the 16-bit operands: ignored
        out = _run_ptx(kernels.Q6K_ASM.value, regs)
        for j, (q, s) in enumerate(((lo, 0), (lo, 0), (lo2, 1), (lo2, 1))):
            h = j % 2
            want = [128 + (((b >> (4 * h)) & 15) | (((e >> (2 * (2 * h + s))) & 3) << 4)) for b, e in zip(q, high, strict=True)]
            assert [_bf16((out[f"${j}"] >> (16 * i)) & 0xFFFF) for i in range(2)] == want


def test_the_q2_k_ptx_makes_128_plus_each_two_bit_value_in_bf16() -> None:
    """The Q2_K PTX of kernels A and B, instruction by instruction: two bytes give ``128 + u`` of their four 2-bit
    fields (``value = d scale u - dmin min``), field ``s`` in output ``s``."""
    from stagewise.kernels import quant_bf16_triton as kernels

    rng = torch.Generator().manual_seed(3)
    for _ in range(256):
        q = torch.randint(0, 256, (2,), generator=rng).tolist()
        out = _run_ptx(kernels.Q2K_ASM.value, {"$4": q[0] | q[1] << 8 | int(torch.randint(0, 1 << 16, (), generator=rng)) << 16})
        for s in range(4):
            assert [_bf16((out[f"${s}"] >> (16 * i)) & 0xFFFF) for i in range(2)] == [128 + ((b >> (2 * s)) & 3) for b in q]


def test_the_q3_k_ptx_makes_128_plus_each_three_bit_value_in_bf16() -> None:
    """The Q3_K PTX of kernels A and B, instruction by instruction: two low-bit bytes and their high-bit bytes give
    ``128 + u`` of the four 2-bit fields, ``u`` the field with bit ``4 half + s`` of the high byte as its bit 2, as
    gguf's Q3_K puts them together (``value = d (scale - 32) (u - 4)``)."""
    from stagewise.kernels import quant_bf16_triton as kernels

    rng = torch.Generator().manual_seed(2)
    for half, text in enumerate((kernels.Q3K_ASM0, kernels.Q3K_ASM1)):
        for _ in range(256):
            q, hm = (torch.randint(0, 256, (2,), generator=rng).tolist() for _ in range(2))
            regs = {f"${4 + i}": b[0] | b[1] << 8 | int(torch.randint(0, 1 << 16, (), generator=rng)) << 16
                    for i, b in enumerate((q, hm))}  # bits above the 16-bit operands: ignored
            out = _run_ptx(text.value, regs)
            for s in range(4):
                want = [128 + (((b >> (2 * s)) & 3) | (((h >> (4 * half + s)) & 1) << 2)) for b, h in zip(q, hm, strict=True)]
                assert [_bf16((out[f"${s}"] >> (16 * i)) & 0xFFFF) for i in range(2)] == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tokens", [8, 128], ids=["kernel-A-blocks", "kernel-B-blocks"])
def test_compiled_expert_blocks_in_bf16_match_the_grouped_gemm(tokens: int) -> None:
    """The expert blocks with SiLU·up fused (a Q4_K_M mix: Q4_K gate/up, Q6_K down) against the grouped GEMM on
    the same stacks, bf16, a 64-expert top-8 layer: 8 tokens (kernel A's 16-row blocks), 128 (kernel B's 64)."""
    from stagewise.kernels.moe_experts import grouped_swiglu_experts, packed_config, packed_experts_config

    experts, top_k, hidden, inter = 64, 8, 2048, 512
    gate_up = _weight(T.Q4_K, (experts, 2 * inter), hidden, seed=1)
    down = _weight(T.Q6_K, (experts, hidden), inter, seed=2)
    g = torch.Generator("cuda").manual_seed(3)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)
    top_weight, top_index = torch.topk(torch.softmax(torch.randn(tokens, experts, device="cuda", generator=g), -1),
                                       top_k, dim=-1)
    top_weight = top_weight.to(torch.bfloat16)
    blocks = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down, packed_experts_config(gate_up, down, tokens * top_k, experts, x.device))
    grouped = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down,
                                     packed_config(x.device, gate_up, down, tokens * top_k, experts))
    assert float((blocks.float() - grouped.float()).norm() / grouped.float().norm()) <= 2e-2
    assert torch.equal(grouped_swiglu_experts(x, top_index, top_weight, gate_up, down,
                                              packed_experts_config(gate_up, down, tokens * top_k, experts, x.device)), blocks)


def test_the_codebook_ptx_looks_up_every_nibble_in_bf16() -> None:
    """Kernel A's IQ4_NL / IQ4_XS and MXFP4 lookups (inline PTX, not run by the interpreter): every byte's low and
    high nibble give their codebook entry, exactly."""
    from stagewise.kernels import quant_bf16_triton as kernels

    tables = {kernels.IQ4_ASM: (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113),
              kernels.FP4_ASM: (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)}
    for text, values in tables.items():
        for first in range(0, 256, 2):
            q = [first, first + 1][::-1 if first % 4 else 1]
            junk = (first * 0x9E37) << 16 & 0xFFFF0000  # above the 16-bit operand: ignored
            out = _run_ptx(text.value, {"$2": q[0] | q[1] << 8 | junk})
            lanes = [(out[f"${r}"] >> (16 * i)) & 0xFFFF for r in (0, 1) for i in range(2)]
            assert [_bf16(v) for v in lanes] == [values[b & 15] for b in q] + [values[b >> 4] for b in q]
