"""Quantization of float rows into every packed GGUF block type, in torch (the writer's side).

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 repeat ``gguf.quants.quantize``'s arithmetic, so their bytes
equal it. gguf-py has no quantizer for the K-quants and IQ4_NL / IQ4_XS; for those this is a
round-to-nearest quantizer in the manner of llama.cpp's ``quantize_row_*_ref`` (no importance
matrix): each sub-block's scale (and min) is the least-squares best of a small grid of candidate
scales, the sub-block scales are then quantized against the block's f16 scale, and every value is
rounded against the scale the file will actually hold. The output is always a valid block
encoding; it is deterministic, but not byte-equal to llama.cpp's quantizer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from stagewise.errors import ConfigError
from stagewise.weights.quant.dequant import IQ4_KVALUES, MXFP4_KVALUES, QK_K, e8m0_to_fp32_half

T = GGMLQuantizationType
CHUNK_ELEMENTS = 1 << 18  # values quantized at a time (the search temporaries are ~20x this in float32)


# ---- byte packing (the inverse of dequant's unpacking) ----

def _f16_bytes(d: torch.Tensor) -> torch.Tensor:
    return d.reshape(-1, 1).to(torch.float16).contiguous().view(torch.uint8)  # (n, 2)


def _pack_nibbles(q: torch.Tensor, group: int) -> torch.Tensor:
    """(n, m*2*group) values 0..15 -> (n, m*group) bytes: the first ``group`` of each run low."""
    q = q.to(torch.uint8).reshape(q.shape[0], -1, 2, group)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(q.shape[0], -1)


def _pack_crumbs(q: torch.Tensor) -> torch.Tensor:
    """(n, m*128) values 0..3 -> (n, m*32) bytes: 32-value run s in bits 2s."""
    q = q.to(torch.uint8).reshape(q.shape[0], -1, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(q.shape[0], -1)


def _pack_bits(bits: torch.Tensor, run: int) -> torch.Tensor:
    """(n, 8*run) bits -> (n, run) bytes: value ``run*b + j`` is bit b of byte j."""
    b = bits.to(torch.uint8).reshape(bits.shape[0], 8, run)
    out = torch.zeros(bits.shape[0], run, dtype=torch.uint8, device=bits.device)
    for k in range(8):
        out |= b[:, k] << k
    return out


def _pack_bits32(bits: torch.Tensor) -> torch.Tensor:
    """(n, 32) bits -> (n, 4) bytes of a little-endian uint32 (bit i of it is value i)."""
    b = bits.to(torch.uint8).reshape(-1, 4, 8)
    out = torch.zeros(b.shape[0], 4, dtype=torch.uint8, device=bits.device)
    for k in range(8):
        out |= b[:, :, k] << k
    return out


def _pack_k_scales(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """Q4_K / Q5_K: eight 6-bit scales and eight 6-bit mins (n, 8) each -> twelve bytes (n, 12)."""
    sc, mn = sc.to(torch.uint8), mn.to(torch.uint8)
    first = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    second = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    third = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return torch.cat([first, second, third], dim=1)


def _pack_q3_k_scales(s: torch.Tensor) -> torch.Tensor:
    """Q3_K: sixteen 6-bit scales (n, 16) -> twelve bytes: low nibbles of 0-7 and 8-15 in bytes
    0-7, the high two bits of scale ``4t + m`` in bits 2t of byte ``8 + m``."""
    s = s.to(torch.uint8)
    low = (s[:, :8] & 0x0F) | ((s[:, 8:] & 0x0F) << 4)
    high = ((s >> 4) & 0x03).reshape(-1, 4, 4)  # (n, t, m)
    high = high[:, 0] | (high[:, 1] << 2) | (high[:, 2] << 4) | (high[:, 3] << 6)
    return torch.cat([low, high], dim=1)


# ---- the legacy types and MXFP4: gguf.quants' arithmetic, step for step ----

def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _signed_absmax(x: torch.Tensor) -> torch.Tensor:
    """The value of largest magnitude of each row (the first one on ties), with its sign: (n, 1)."""
    return x.gather(1, x.abs().argmax(dim=1, keepdim=True))


def quantize_q8_0(values: torch.Tensor) -> torch.Tensor:
    """GGUF Q8_0 blocks ``(n, 34)`` uint8 on the CPU, computed where ``values`` live.

    The same arithmetic as ``gguf.quants`` (float32 scale = max|x| / 127, round half away from
    zero, f16 scale first), so the bytes match it exactly.
    """
    return _q8_0(values.to(torch.float32).reshape(-1, 32)).cpu()


def _roundf(v: torch.Tensor) -> torch.Tensor:
    """Round half away from zero exactly as ``gguf.quants.np_roundf`` (no ``+ 0.5`` rounding slip)."""
    a = v.abs()
    floored = torch.floor(a)
    return torch.sign(v) * (floored + torch.floor(2 * (a - floored)))


def _q8_0(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(dim=1, keepdim=True) / 127
    qs = _roundf(x * _inverse(d)).to(torch.int8)
    return torch.cat([_f16_bytes(d), qs.view(torch.uint8)], dim=1)  # (n, 2 + 32)


def _q4_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_absmax(x) / -8
    q = torch.trunc(x * _inverse(d) + 8.5).clamp(0, 15)
    return torch.cat([_f16_bytes(d), _pack_nibbles(q, 16)], dim=1)  # (n, 2 + 16)


def _q4_1(x: torch.Tensor) -> torch.Tensor:
    hi, lo = x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True)
    d = (hi - lo) / 15
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).clamp(0, 15)
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q, 16)], dim=1)  # (n, 2 + 2 + 16)


def _q5_pack(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = q.to(torch.uint8)
    qs = (q[:, :16] & 0x0F) | (q[:, 16:] << 4)  # NOTE: uint8 shift drops the fifth bit, as numpy's
    return _pack_bits32(q >> 4), qs


def _q5_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_absmax(x) / -16
    qh, qs = _q5_pack(torch.trunc(x * _inverse(d) + 16.5).clamp(0, 31))
    return torch.cat([_f16_bytes(d), qh, qs], dim=1)  # (n, 2 + 4 + 16)


def _q5_1(x: torch.Tensor) -> torch.Tensor:
    hi, lo = x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True)
    d = (hi - lo) / 31
    qh, qs = _q5_pack(torch.trunc((x - lo) * _inverse(d) + 0.5).clamp(0, 31))
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), qh, qs], dim=1)  # (n, 2 + 2 + 4 + 16)


def _mxfp4(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    amax = x.abs().amax(dim=1, keepdim=True)
    # NOTE: clamped at 0 where gguf.quants' uint8 cast is undefined (max|x| < 2**-125)
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2 + 127, torch.zeros_like(amax))
    e = exponent.clamp(0, 254).to(torch.uint8)  # (n, 1)
    d = e8m0_to_fp32_half(e)
    kvalues = torch.tensor(MXFP4_KVALUES, dtype=torch.float32, device=x.device).reshape(1, 1, 16)
    errs = (d.reshape(n, 1, 1) * kvalues - x.reshape(n, 32, 1)).abs()
    best = errs.argmin(dim=-1)  # (n, 32), the first code on ties (+0 before -0)
    return torch.cat([e, _pack_nibbles(best, 16)], dim=1)  # (n, 1 + 16)


# ---- the K-quants and IQ4: least-squares scale search, then round against the stored scales ----

def _symmetric_scale(x: torch.Tensor, nmax: int) -> torch.Tensor:
    """Signed scale ``a`` (n, 1) minimising ``|x - a L|^2`` with ``L = round(x / a)`` in
    ``[-nmax, nmax - 1]``, over 19 candidates that map the largest-magnitude value near ``-nmax``
    (llama.cpp's ``make_qx_quants``, unweighted)."""
    peak = _signed_absmax(x)  # (n, 1)
    steps = torch.arange(-9, 10, dtype=torch.float32, device=x.device).reshape(1, -1, 1) * 0.1
    iscale = -(nmax + steps) / torch.where(peak == 0, torch.ones_like(peak), peak).unsqueeze(1)  # (n, C, 1)
    levels = torch.round(iscale * x.unsqueeze(1)).clamp(-nmax, nmax - 1)  # (n, C, G)
    sumlx = (levels * x.unsqueeze(1)).sum(dim=-1)  # (n, C)
    suml2 = (levels * levels).sum(dim=-1)
    score = torch.where(suml2 > 0, sumlx * sumlx / suml2.clamp(min=1), torch.zeros_like(sumlx))
    best = score.argmax(dim=1, keepdim=True)
    scale = sumlx.gather(1, best) / suml2.gather(1, best).clamp(min=1)
    return torch.where(peak == 0, torch.zeros_like(scale), scale)


def _affine_scale_min(x: torch.Tensor, nmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale ``a >= 0`` and offset ``m >= 0`` (n, 1) each minimising ``|x - (a L - m)|^2`` with
    ``L`` in ``[0, nmax]``, over 21 candidate scales around ``(max - min) / nmax`` with a
    least-squares fit of both for each (llama.cpp's ``make_qkx2_quants``, unweighted)."""
    g = x.shape[1]
    lo = x.amin(dim=1, keepdim=True).clamp(max=0)
    span = x.amax(dim=1, keepdim=True) - lo  # (n, 1), 0 only for a constant non-positive row
    safe_span = torch.where(span > 0, span, torch.ones_like(span)).unsqueeze(1)
    steps = torch.arange(0, 21, dtype=torch.float32, device=x.device).reshape(1, -1, 1) * 0.1 - 1.0
    iscale = (nmax + steps) / safe_span  # (n, C, 1)
    xs = x.unsqueeze(1)  # (n, 1, G)
    levels = torch.round(iscale * (xs - lo.unsqueeze(1))).clamp(0, nmax)  # (n, C, G)
    sl, sl2 = levels.sum(dim=-1), (levels * levels).sum(dim=-1)  # (n, C)
    sx, slx = xs.sum(dim=-1), (levels * xs).sum(dim=-1)
    det = g * sl2 - sl * sl
    ok = det > 0
    safe_det = torch.where(ok, det, torch.ones_like(det))
    a = (g * slx - sl * sx) / safe_det
    b = (sl2 * sx - sl * slx) / safe_det
    positive = b > 0  # the offset may only subtract: refit the scale alone through 0
    a = torch.where(positive, slx / sl2.clamp(min=1), a)
    b = torch.where(positive, torch.zeros_like(b), b)
    err = ((a.unsqueeze(-1) * levels + b.unsqueeze(-1) - xs) ** 2).sum(dim=-1)
    err = torch.where(ok & (a >= 0), err, torch.full_like(err, float("inf")))
    # the plain min/max candidate, always valid
    a0, b0 = span / nmax, lo
    l0 = torch.round((x - lo) / safe_span.squeeze(1) * nmax).clamp(0, nmax)
    err0 = ((a0 * l0 + b0 - x) ** 2).sum(dim=1, keepdim=True)
    best = err.argmin(dim=1, keepdim=True)
    use_search = err.gather(1, best) < err0
    scale = torch.where(use_search, a.gather(1, best), a0)
    offset = -torch.where(use_search, b.gather(1, best), b0)
    return scale, offset


def _codes(scale: torch.Tensor, q: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """``round(q / scale)`` clamped to ``[lo, hi]``, 0 where the scale is 0 (every value is then 0)."""
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.where(scale == 0, torch.zeros_like(q), torch.round(q / safe)).clamp(lo, hi)


def _super_scale(sub: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsigned sub-block scales (n, S) -> (f16-rounded block scale (n, 1), integer codes 0..levels)."""
    top = sub.amax(dim=1, keepdim=True)
    d = (top / levels).to(torch.float16).to(torch.float32)
    return d, _codes(d, sub, 0, levels)


def _signed_super_scale(sub: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Signed sub-block scales (n, S) -> (f16-rounded block scale, codes in [lo, hi]); the
    largest-magnitude scale maps to ``lo`` (the extra negative code)."""
    d = (_signed_absmax(sub) / lo).to(torch.float16).to(torch.float32)
    return d, _codes(d, sub, lo, hi)


def _affine_k(x: torch.Tensor, group: int, nmax: int, scale_levels: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q2_K / Q4_K / Q5_K: (d, dmin, scale codes, min codes, value codes 0..nmax) of 256-blocks."""
    n = x.shape[0]
    sub = x.reshape(-1, group)
    scale, offset = _affine_scale_min(sub, nmax)
    d, sc = _super_scale(scale.reshape(n, -1), scale_levels)
    dmin, mn = _super_scale(offset.reshape(n, -1), scale_levels)
    eff_scale = (d * sc).reshape(-1, 1)
    eff_min = (dmin * mn).reshape(-1, 1)
    q = _codes(eff_scale, sub + eff_min, 0, nmax).reshape(n, QK_K)
    return d, dmin, sc, mn, q


def _q2_k(x: torch.Tensor) -> torch.Tensor:
    d, dmin, sc, mn, q = _affine_k(x, 16, 3, 15)
    scales = sc.to(torch.uint8) | (mn.to(torch.uint8) << 4)
    return torch.cat([scales, _pack_crumbs(q), _f16_bytes(d), _f16_bytes(dmin)], dim=1)  # (n, 16 + 64 + 2 + 2)


def _q4_k(x: torch.Tensor) -> torch.Tensor:
    d, dmin, sc, mn, q = _affine_k(x, 32, 15, 63)
    return torch.cat([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, mn), _pack_nibbles(q, 32)],
                     dim=1)  # (n, 2 + 2 + 12 + 128)


def _q5_k(x: torch.Tensor) -> torch.Tensor:
    d, dmin, sc, mn, q = _affine_k(x, 32, 31, 63)
    q = q.to(torch.uint8)
    return torch.cat([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, mn), _pack_bits(q >> 4, 32),
                      _pack_nibbles(q & 0x0F, 32)], dim=1)  # (n, 2 + 2 + 12 + 32 + 128)


def _symmetric_k(x: torch.Tensor, nmax: int, scale_lo: int, scale_hi: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q3_K / Q6_K: (d, signed scale codes (n, 16), value codes in [-nmax, nmax - 1]) of 256-blocks."""
    n = x.shape[0]
    sub = x.reshape(-1, 16)
    d, sc = _signed_super_scale(_symmetric_scale(sub, nmax).reshape(n, -1), scale_lo, scale_hi)
    q = _codes((d * sc).reshape(-1, 1), sub, -nmax, nmax - 1).reshape(n, QK_K)
    return d, sc, q


def _q3_k(x: torch.Tensor) -> torch.Tensor:
    d, sc, q = _symmetric_k(x, 4, -32, 31)
    u = (q + 4).to(torch.uint8)  # 0..7: two low bits in qs, the third in hmask
    scales = _pack_q3_k_scales(sc + 32)
    return torch.cat([_pack_bits(u >> 2, 32), _pack_crumbs(u & 0x03), scales, _f16_bytes(d)],
                     dim=1)  # (n, 32 + 64 + 12 + 2)


def _q6_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    d, sc, q = _symmetric_k(x, 32, -128, 127)
    u = (q + 32).to(torch.uint8).reshape(n, 2, 128)  # two 128-value halves
    ql = _pack_nibbles((u & 0x0F).reshape(n, -1), 64)  # (n, 128)
    qh = _pack_crumbs((u >> 4).reshape(n, -1))  # (n, 64)
    scales = sc.to(torch.int8).view(torch.uint8)
    return torch.cat([ql, qh, scales, _f16_bytes(d)], dim=1)  # (n, 128 + 64 + 16 + 2)


_IQ4_GRID = torch.tensor(IQ4_KVALUES, dtype=torch.float32)
_IQ4_MIDPOINTS = (_IQ4_GRID[1:] + _IQ4_GRID[:-1]) / 2


def _iq4_index(v: torch.Tensor) -> torch.Tensor:
    """Index of the nearest IQ4 codebook value to each of ``v``."""
    return torch.bucketize(v, _IQ4_MIDPOINTS.to(v.device))


def _iq4_scale(x: torch.Tensor) -> torch.Tensor:
    """Signed scale (n, 1) for 32-value groups on the IQ4 codebook: the least-squares best of 15
    candidates mapping the largest-magnitude value near -127 (llama.cpp's ``ntry = 7``)."""
    peak = _signed_absmax(x)
    safe = torch.where(peak == 0, torch.ones_like(peak), peak).unsqueeze(1)  # (n, 1, 1)
    tries = torch.arange(-7, 8, dtype=torch.float32, device=x.device).reshape(1, -1, 1)
    inv = (tries + IQ4_KVALUES[0]) / safe  # (n, C, 1)
    grid = _IQ4_GRID.to(x.device)
    values = grid[_iq4_index(inv * x.unsqueeze(1))]  # (n, C, G)
    sumqx = (values * x.unsqueeze(1)).sum(dim=-1)
    sumq2 = (values * values).sum(dim=-1)  # > 0: the codebook has no zero
    best = (sumqx * sumqx / sumq2).argmax(dim=1, keepdim=True)
    scale = sumqx.gather(1, best) / sumq2.gather(1, best)
    return torch.where(peak == 0, torch.zeros_like(scale), scale)


def _iq4_codes(scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return _iq4_index(torch.where(scale == 0, torch.zeros_like(x), x / safe))


def _iq4_nl(x: torch.Tensor) -> torch.Tensor:
    d = _iq4_scale(x).to(torch.float16).to(torch.float32)
    return torch.cat([_f16_bytes(d), _pack_nibbles(_iq4_codes(d, x), 16)], dim=1)  # (n, 2 + 16)


def _iq4_xs(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    sub = x.reshape(-1, 32)
    d, sc = _signed_super_scale(_iq4_scale(sub).reshape(n, -1), -32, 31)  # (n, 1), (n, 8)
    codes = _iq4_codes((d * sc).reshape(-1, 1), sub).reshape(n, -1)
    u = (sc + 32).to(torch.int32)  # 6-bit: low nibbles in scales_l, high two bits in scales_h
    shifts = torch.arange(0, 16, 2, dtype=torch.int32, device=x.device)
    scales_h = ((u >> 4) << shifts).sum(dim=1, keepdim=True)  # (n, 1) uint16
    scales_h = torch.cat([scales_h & 0xFF, scales_h >> 8], dim=1).to(torch.uint8)
    low = (u & 0x0F).to(torch.uint8)
    scales_l = low[:, 0::2] | (low[:, 1::2] << 4)  # scale i: nibble i % 2 of byte i // 2
    return torch.cat([_f16_bytes(d), scales_h, scales_l, _pack_nibbles(codes, 16)], dim=1)  # (n, 2 + 2 + 4 + 128)


QUANTIZERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k,
    T.IQ4_NL: _iq4_nl, T.IQ4_XS: _iq4_xs, T.MXFP4: _mxfp4,
}


def quantize(values: torch.Tensor, ggml_type: GGMLQuantizationType) -> torch.Tensor:
    """GGUF blocks of ``values`` ``(rows, K)`` as uint8 ``(rows, K // block * type_bytes)``,
    computed (and returned) on ``values``' device, ``CHUNK_ELEMENTS`` values at a time.

    Raises:
        ConfigError: ``ggml_type`` is not a packed type.
        ValueError: ``K`` is not a whole number of the type's blocks, or a value is NaN/Inf.
    """
    fn = QUANTIZERS.get(ggml_type)
    if fn is None:
        raise ConfigError(f"cannot quantize to GGUF type {ggml_type.name}")
    block, type_bytes = GGML_QUANT_SIZES[ggml_type]
    if values.dim() != 2 or values.shape[1] % block:
        raise ValueError(f"{ggml_type.name} needs (rows, K) with K a multiple of {block}, got {tuple(values.shape)}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{ggml_type.name}: cannot quantize NaN or Inf values")
    rows = values.shape[0]
    blocks = values.reshape(-1, block)
    out = torch.empty(blocks.shape[0], type_bytes, dtype=torch.uint8, device=values.device)
    step = max(1, CHUNK_ELEMENTS // block)
    for lo in range(0, blocks.shape[0], step):
        out[lo : lo + step] = fn(blocks[lo : lo + step].to(torch.float32))
    return out.reshape(rows, -1)
