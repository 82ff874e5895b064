"""The chunked gated delta rule over a packed step's segments, states read and written by index: two Triton launches.

Same contract as :func:`stagewise.models.layers.delta_rule.packed_chunked_gated_delta_rule`; the
design follows flash-linear-attention's chunked forward (kkt, solve_tril, recompute w/u, chunk state,
output), written for our state pool and exactness rules:

1. :func:`_chunk_prep_kernel`, one program per (chunk, value head), all chunks of the step at once:
   computes the gates from their inputs (:class:`~stagewise.models.layers.decay_gates.DecayGates`),
   L2-normalizes q/k, cumulates the log decay, and forms the chunk's UT transform: ``L`` (the strictly
   lower ``beta k k^T`` weighted by the pairwise decay), ``(I + L)^-1`` (forward substitution inside
   16-row blocks, then the block-strictly-lower rest as a terminating Neumann series), ``w`` (the
   decayed ``beta k`` through it), ``u`` (``beta v`` through it), the causal ``q k^T`` weighted by the
   decay, and per-token scales of q and k (norm, decay). It stores them to float32 scratch laid out
   per (token, value head), no padding rows: ``N x Hv x (Dk + Dv + 64 + 2)`` floats, plus one decay per
   (chunk, value head) (80.5 MiB for 2,048 tokens at Qwen3.6's dims).
2. :func:`_chunk_scan_kernel`, one program per (segment, value head, ``BLOCK_V`` value columns): reads
   the segment's state entry, walks its chunks in order keeping its state slice in registers
   (``v_new = u - w S``, ``o = q S + A v_new``, ``S = decay S + k^T v_new``, q and k read raw and
   scaled per row), stores each chunk's readout, the state at the snapshot boundary and the final state.

A chunk's arithmetic depends only on its own tokens (the prep) and the state before it (the scan), and
the launch configuration only on the model's dimensions, so one call over a prompt and several calls
over its chunk-aligned pieces (state carried through entries, or a snapshot) agree bit for bit.
Float32 inputs take IEEE ``tl.dot`` (tests); others TF32 on float32 operands (the state stays float32).

Compiled ahead of time for sm_90 with Triton 3.6 at Qwen3.6's dims (bf16, Dk = Dv = 128): the prep
226 registers (4 warps), the scan 235 (32 value columns, 8 warps), neither spilling; GPU timings are
``bench/deltanet_packed.py``'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import cdiv, dependent_launch, launch_device, next_power_of_2
from stagewise.models.layers.decay_gates import DecayGates
from stagewise.models.layers.packed_segments import CHUNK, PackedSegments

SUB = 16  # rows of the diagonal blocks inverted by forward substitution


@triton.jit
def _unit_lower_inverse(strict, CHUNK: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr):
    """``(I + strict)^-1`` of a strictly lower ``(CHUNK, CHUNK)`` float32 tile."""
    r = tl.arange(0, CHUNK)
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    b = tl.arange(0, CHUNK // SUB)
    blocks = (b[:, None] == b[None, :]).to(tl.float32)  # (NB, NB), NB = CHUNK // SUB blocks
    diag = tl.sum(tl.reshape(strict, (CHUNK // SUB, SUB, CHUNK // SUB, SUB)) * blocks[:, None, :, None],
                  axis=2)  # (NB, SUB, SUB)
    row_id = tl.arange(0, SUB)[None, :, None]
    inv = tl.zeros((CHUNK // SUB, SUB, SUB), dtype=tl.float32)  # strictly lower part of each block's inverse
    for i in range(1, SUB):  # row i of every block at once: X_i = -L_i - L_i X
        row = -tl.sum(tl.where(row_id == i, diag, 0.0), axis=1)  # (NB, SUB)
        row = row + tl.sum(row[:, :, None] * inv, axis=1)
        inv = tl.where(row_id == i, row[:, None, :], inv)
    block_inv = tl.reshape(inv[:, :, None, :] * blocks[:, None, :, None], (CHUNK, CHUNK)) + eye  # (I + D)^-1
    # I + L = (I + D)(I + N) with N = (I + D)^-1 (L - D) block-strictly-lower: N^NB = 0
    same = (r[:, None] // SUB) == (r[None, :] // SUB)
    n = tl.dot(block_inv, tl.where(same, 0.0, strict), input_precision=PRECISION)
    series = eye - n
    for _ in tl.static_range(CHUNK // SUB - 2):
        series = eye - tl.dot(n, series, input_precision=PRECISION)  # I - N + N^2 - ...
    return tl.dot(series, block_inv, input_precision=PRECISION)


@triton.jit
def _columns(ptr, t, t_ok, d, d_ok, stride_n):
    """Columns ``d`` of rows ``t`` of ``ptr`` as float32 (zero where not ``t_ok``)."""
    return tl.load(ptr + t[:, None].to(tl.int64) * stride_n + d[None, :], mask=t_ok[:, None] & d_ok[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _chunk_prep_kernel(
    q_ptr, k_ptr, v_ptr, gate_a_ptr, gate_b_ptr, alog_ptr, dtb_ptr, cu_ptr, chunks_ptr, w_ptr, u_ptr, a_ptr,
    scales_ptr, decay_ptr, group, dk, dv, scale,
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_an, stride_bn,
    CHUNK: tl.constexpr, SUB: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr, GDC: tl.constexpr,
):
    # NOTE: head dims are walked BLOCK_D columns at a time, so that only (C, C) tiles and one
    # (C, BLOCK_D) column block stay live (whole (C, Dk) rows spill registers at Dk = 128)
    wait_for_predecessor(GDC)
    chunk = tl.program_id(0)
    h = tl.program_id(1)
    heads = tl.num_programs(1)
    seg = tl.load(chunks_ptr + 2 * chunk)
    t = tl.load(chunks_ptr + 2 * chunk + 1) + tl.arange(0, CHUNK)  # the chunk's tokens, padded to CHUNK
    t_ok = t < tl.load(cu_ptr + seg + 1)
    r = tl.arange(0, CHUNK)
    q_base = q_ptr + (h // group) * stride_qh
    k_base = k_ptr + (h // group) * stride_kh
    q_sq = tl.zeros((CHUNK,), dtype=tl.float32)
    k_sq = tl.zeros((CHUNK,), dtype=tl.float32)
    for d0 in tl.static_range(0, BLOCK_K, BLOCK_D):  # the rows' squared norms
        d = d0 + tl.arange(0, BLOCK_D)
        q = _columns(q_base, t, t_ok, d, d < dk, stride_qn)
        k = _columns(k_base, t, t_ok, d, d < dk, stride_kn)
        q_sq += tl.sum(q * q, axis=1)
        k_sq += tl.sum(k * k, axis=1)
    q_norm = tl.rsqrt(q_sq + 1e-6)
    k_norm = tl.rsqrt(k_sq + 1e-6)
    # the gates (DecayGates.values, the same formula): beta = sigmoid(b) kept in the activation dtype,
    # g = -exp(A_log) softplus(a + dt_bias) in float32; padding rows: beta 0, g 0
    b_in = tl.load(gate_b_ptr + t.to(tl.int64) * stride_bn + h, mask=t_ok, other=0.0).to(tl.float32)
    beta = (1.0 / (1.0 + tl.exp(-b_in))).to(gate_b_ptr.dtype.element_ty).to(tl.float32)
    beta = tl.where(t_ok, beta, 0.0)
    shifted = tl.load(gate_a_ptr + t.to(tl.int64) * stride_an + h, mask=t_ok, other=0.0).to(tl.float32) \
        + tl.load(dtb_ptr + h).to(tl.float32)
    softplus = tl.where(shifted > 20.0, shifted, tl.log(1.0 + tl.exp(tl.minimum(shifted, 20.0))))
    g = tl.where(t_ok, -tl.exp(tl.load(alog_ptr + h).to(tl.float32)) * softplus, 0.0)
    kk = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    qk = tl.zeros((CHUNK, CHUNK), dtype=tl.float32)
    for d0 in tl.static_range(0, BLOCK_K, BLOCK_D):  # beta k k^T and q k^T, normalized
        d = d0 + tl.arange(0, BLOCK_D)
        k = _columns(k_base, t, t_ok, d, d < dk, stride_kn) * k_norm[:, None]
        q = _columns(q_base, t, t_ok, d, d < dk, stride_qn) * q_norm[:, None] * scale
        kk += tl.dot(k * beta[:, None], tl.trans(k), input_precision=PRECISION)
        qk += tl.dot(q, tl.trans(k), input_precision=PRECISION)
    cum = tl.cumsum(g, axis=0)
    lower = r[:, None] >= r[None, :]
    pair = tl.where(lower, tl.exp(tl.where(lower, cum[:, None] - cum[None, :], 0.0)), 0.0)  # (C, C) decay j -> i
    rows = t.to(tl.int64) * heads + h  # (C,) the tokens' rows in the (N, Hv, ...) scratch
    last = tl.sum(tl.where(r == CHUNK - 1, cum, 0.0), axis=0)  # log decay over the whole (padded) chunk
    tl.store(scales_ptr + rows * 2, q_norm * scale * tl.exp(cum), mask=t_ok)  # q's row scale in the scan
    tl.store(scales_ptr + rows * 2 + 1, k_norm * tl.exp(last - cum), mask=t_ok)  # k's
    tl.store(decay_ptr + chunk.to(tl.int64) * heads + h, tl.exp(last))
    tl.store(a_ptr + rows[:, None] * CHUNK + r[None, :], qk * pair, mask=t_ok[:, None])
    inv = _unit_lower_inverse(tl.where(r[:, None] > r[None, :], kk * pair, 0.0), CHUNK, SUB, PRECISION)
    k_scale = k_norm * beta * tl.exp(cum)  # w = inv (beta k exp(cum))
    for d0 in tl.static_range(0, BLOCK_K, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        k = _columns(k_base, t, t_ok, d, d < dk, stride_kn) * k_scale[:, None]
        w = tl.dot(inv, k, input_precision=PRECISION)  # (C, BLOCK_D)
        tl.store(w_ptr + rows[:, None] * dk + d[None, :], w, mask=t_ok[:, None] & (d < dk)[None, :])
    for d0 in tl.static_range(0, BLOCK_DV, BLOCK_D):  # u = inv (beta v)
        d = d0 + tl.arange(0, BLOCK_D)
        v = _columns(v_ptr + h * stride_vh, t, t_ok, d, d < dv, stride_vn) * beta[:, None]
        u = tl.dot(inv, v, input_precision=PRECISION)  # (C, BLOCK_D)
        tl.store(u_ptr + rows[:, None] * dv + d[None, :], u, mask=t_ok[:, None] & (d < dv)[None, :])


@triton.jit
def _chunk_scan_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, a_ptr, scales_ptr, decay_ptr, pool_ptr, o_ptr,
    cu_ptr, chunk_offsets_ptr, read_ptr, write_ptr, snap_ptr, snap_at_ptr,
    heads, group, dk, dv,
    stride_qn, stride_qh, stride_kn, stride_kh, stride_pe, stride_on, stride_oh,
    CHUNK: tl.constexpr, HALF_K: tl.constexpr, BLOCK_V: tl.constexpr, PRECISION: tl.constexpr,
    GDC: tl.constexpr,
):
    # NOTE: the state slice is kept as two (HALF_K, BLOCK_V) halves of the key dim, and q/k/w are read
    # half by half, so that no (C, Dk) float32 tile is live (at Dk = 128 one spills registers)
    wait_for_predecessor(GDC)
    blocks_v = tl.cdiv(dv, BLOCK_V)
    h = tl.program_id(0) // blocks_v
    vd = (tl.program_id(0) % blocks_v) * BLOCK_V + tl.arange(0, BLOCK_V)
    seg = tl.program_id(1)
    bos = tl.load(cu_ptr + seg)
    eos = tl.load(cu_ptr + seg + 1)
    first_chunk = tl.load(chunk_offsets_ptr + seg)
    snap_at = tl.load(snap_at_ptr + seg)
    snap = tl.load(snap_ptr + seg).to(tl.int64)
    r = tl.arange(0, CHUNK)
    k1 = tl.arange(0, HALF_K)
    k2 = HALF_K + k1
    vd_ok = vd < dv
    tile1 = h * dk * dv + k1[:, None] * dv + vd[None, :]  # this program's slices of an entry
    tile2 = h * dk * dv + k2[:, None] * dv + vd[None, :]
    ok1 = (k1 < dk)[:, None] & vd_ok[None, :]
    ok2 = (k2 < dk)[:, None] & vd_ok[None, :]
    source = pool_ptr + tl.load(read_ptr + seg).to(tl.int64) * stride_pe
    s1 = tl.load(source + tile1, mask=ok1, other=0.0)  # (HALF_K, BV) float32
    s2 = tl.load(source + tile2, mask=ok2, other=0.0)
    q_base = q_ptr + (h // group) * stride_qh
    k_base = k_ptr + (h // group) * stride_kh
    for i in range(tl.cdiv(eos - bos, CHUNK)):
        t = bos + i * CHUNK + r
        t_ok = t < eos
        rows = t.to(tl.int64) * heads + h  # (C,) the tokens' rows in the (N, Hv, ...) scratch
        # the padding rows of the last chunk (zeros in w and u, adding zeros through intra) are not read
        w_rows = w_ptr + rows[:, None] * dk
        ws = tl.dot(tl.load(w_rows + k1[None, :], mask=t_ok[:, None] & (k1 < dk)[None, :], other=0.0), s1,
                    input_precision=PRECISION)
        ws = tl.dot(tl.load(w_rows + k2[None, :], mask=t_ok[:, None] & (k2 < dk)[None, :], other=0.0), s2, ws,
                    input_precision=PRECISION)
        u = tl.load(u_ptr + rows[:, None] * dv + vd[None, :], mask=t_ok[:, None] & vd_ok[None, :], other=0.0)
        v_new = u - ws  # (C, BV)
        q_scale = tl.load(scales_ptr + rows * 2, mask=t_ok, other=0.0)[:, None]
        out = tl.dot(_columns(q_base, t, t_ok, k1, k1 < dk, stride_qn) * q_scale, s1, input_precision=PRECISION)
        out = tl.dot(_columns(q_base, t, t_ok, k2, k2 < dk, stride_qn) * q_scale, s2, out, input_precision=PRECISION)
        intra = tl.load(a_ptr + rows[:, None] * CHUNK + r[None, :], mask=t_ok[:, None], other=0.0)
        out = tl.dot(intra, v_new, out, input_precision=PRECISION)
        tl.store(o_ptr + t[:, None].to(tl.int64) * stride_on + h * stride_oh + vd[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=t_ok[:, None] & vd_ok[None, :])
        k_scale = tl.load(scales_ptr + rows * 2 + 1, mask=t_ok, other=0.0)[:, None]
        decay = tl.load(decay_ptr + (first_chunk + i).to(tl.int64) * heads + h)
        k_half = _columns(k_base, t, t_ok, k1, k1 < dk, stride_kn) * k_scale
        s1 = s1 * decay + tl.dot(tl.trans(k_half), v_new, input_precision=PRECISION)
        k_half = _columns(k_base, t, t_ok, k2, k2 < dk, stride_kn) * k_scale
        s2 = s2 * decay + tl.dot(tl.trans(k_half), v_new, input_precision=PRECISION)
        if snap_at == (i + 1) * CHUNK:
            tl.store(pool_ptr + snap * stride_pe + tile1, s1, mask=ok1)
            tl.store(pool_ptr + snap * stride_pe + tile2, s2, mask=ok2)
    target = pool_ptr + tl.load(write_ptr + seg).to(tl.int64) * stride_pe
    tl.store(target + tile1, s1, mask=ok1)
    tl.store(target + tile2, s2, mask=ok2)


def packed_gated_delta_rule_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: DecayGates,
                                   pool: torch.Tensor, segments: PackedSegments,
                                   out: torch.Tensor | None = None, block_v: int = 32, scan_warps: int = 8,
                                   scan_stages: int = 1, prep_warps: int = 4, block_d: int = 32,
                                   precision: str | None = None) -> torch.Tensor:
    """:func:`~stagewise.models.layers.delta_rule.packed_chunked_gated_delta_rule` in two launches.

    The keyword tuning (``block_v`` value columns per scan program, ``block_d`` head-dim columns per
    step of the prep, warps, pipeline stages, ``tl.dot`` precision: ``ieee`` for float32 inputs, else ``tf32`` unless given) is for benchmarks.
    # NOTE: a serving path must fix them per model, never per step: a different tiling may round differently.
    """
    tokens, k_heads, dk = q.shape
    v_heads, dv = v.shape[1], v.shape[2]
    if k.shape != q.shape or v.shape[0] != tokens or gates.b.shape != (tokens, v_heads):
        raise ValueError(f"packed delta rule: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"gates {tuple(gates.b.shape)} do not share tokens and heads")
    if v_heads % k_heads or pool.shape[1:] != (v_heads, dk, dv) or pool.dtype != torch.float32:
        raise ValueError(f"packed delta rule: pool {pool.dtype} {tuple(pool.shape[1:])} is not float32 "
                         f"({v_heads}, {dk}, {dv}) entries, or {v_heads} value heads do not share {k_heads} key heads")
    if any(x.stride(-1) != 1 for x in (q, k, v, gates.a, gates.b)) or pool[0].stride() != (dk * dv, dv, 1):
        raise ValueError("packed delta rule needs contiguous head dims and contiguous pool entries")
    if out is None:
        out = torch.empty((tokens, v_heads, dv), dtype=q.dtype, device=q.device)
    elif out.shape != (tokens, v_heads, dv) or out.stride(-1) != 1:
        raise ValueError(f"packed delta rule: out {tuple(out.shape)} is not ({tokens}, {v_heads}, {dv})")
    if segments.count == 0:
        return out
    chunks = segments.chunk_count
    precision = precision or ("ieee" if q.dtype == torch.float32 else "tf32")
    # float32 scratch per (token, value head): w, u, its row of the chunk's decay-weighted causal q k^T,
    # q's and k's row scales (norm, decay); per (chunk, value head): the chunk's decay
    w, u, intra, scales = (torch.empty((tokens, v_heads, size), dtype=torch.float32, device=q.device)
                           for size in (dk, dv, CHUNK, 2))
    decay = torch.empty((chunks, v_heads), dtype=torch.float32, device=q.device)
    block_k = max(32, next_power_of_2(dk))  # two halves of at least 16 columns in the scan
    block_dv = max(16, next_power_of_2(dv))
    block_v = min(block_v, block_dv)
    group = v_heads // k_heads
    with launch_device(q):
        _chunk_prep_kernel[(chunks, v_heads)](
            q, k, v, gates.a, gates.b, gates.a_log, gates.dt_bias, segments.cu_seqlens, segments.chunks,
            w, u, intra, scales, decay, group, dk, dv, dk**-0.5,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), gates.a.stride(0),
            gates.b.stride(0),
            CHUNK=CHUNK, SUB=SUB, BLOCK_K=block_k, BLOCK_DV=block_dv, BLOCK_D=min(block_d, block_k, block_dv),
            PRECISION=precision, num_warps=prep_warps, **dependent_launch(q),
        )
        _chunk_scan_kernel[(v_heads * cdiv(dv, block_v), segments.count)](
            q, k, w, u, intra, scales, decay, pool, out,
            segments.cu_seqlens, segments.chunk_offsets, segments.read, segments.write, segments.snap,
            segments.snap_at, v_heads, group, dk, dv,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), pool.stride(0), out.stride(0), out.stride(1),
            CHUNK=CHUNK, HALF_K=block_k // 2, BLOCK_V=block_v, PRECISION=precision,
            num_warps=scan_warps, num_stages=scan_stages, **dependent_launch(q),
        )
    return out
