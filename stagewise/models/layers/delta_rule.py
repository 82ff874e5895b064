"""The gated delta rule (Gated DeltaNet's recurrence) in pure torch: a chunked and a recurrent form.

For each value head, with state ``S`` ``(Dk, Dv)``, per token ``t``::

    S = exp(g_t) * S                         # decay
    S = S + k_t (beta_t * (v_t - S^T k_t))^T  # delta-rule write
    o_t = S^T q_t

with ``q``, ``k`` L2-normalized and ``q`` scaled by ``Dk ** -0.5``. Both forms compute this in
float32 (as the reference does) and return the new state in float32. The chunked form (prefill)
condenses ``chunk`` tokens into a few matmuls via the UT transform; the recurrent form (decode)
steps token by token. Both follow transformers' ``torch_chunk_gated_delta_rule`` /
``torch_recurrent_gated_delta_rule`` operation for operation.

Packed steps (:class:`~stagewise.models.layers.packed_segments.PackedSegments`): the state lives in a
pool of entries read and written by index. :func:`packed_chunked_gated_delta_rule` runs a step's
prompt segments (chunk by chunk: every chunk's arithmetic is the same whatever else shares the call,
so a prompt split at chunk boundaries over several steps, or resumed from a snapshot, gives bit for
bit what one call over it gives), :func:`packed_recurrent_step` its decoding rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn import functional as F

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.packed_segments import CHUNK

if TYPE_CHECKING:
    from stagewise.models.layers.decay_gates import DecayGates
    from stagewise.models.layers.packed_segments import PackedSegments



def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Repeat q/k heads to the value heads, go head-major float32, normalize and scale q/k."""
    k_heads, v_heads = k.shape[2], v.shape[2]
    if k_heads != v_heads:
        # each q/k head serves v_heads // k_heads consecutive value heads
        q = q.repeat_interleave(v_heads // k_heads, dim=2)
        k = k.repeat_interleave(v_heads // k_heads, dim=2)
    q, k, v, beta, g = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                        for x in (q, k, v, beta, g))  # (B, Hv, T, ...)
    q, k = _l2norm(q), _l2norm(k)
    q = q * q.shape[-1] ** -0.5
    return q, k, v, g, beta


def chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, state: torch.Tensor,
                             chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule over ``T`` tokens, ``chunk`` at a time.

    Args:
        q, k: ``(B, T, Hk, Dk)``; v: ``(B, T, Hv, Dv)``; g (log decay, <= 0), beta: ``(B, T, Hv)``.
        state: the state before the first token ``(B, Hv, Dk, Dv)`` (not modified).
    Returns:
        output ``(B, T, Hv, Dv)`` in ``q``'s dtype, and the state after the last token (float32).
    """
    dtype, steps = q.dtype, q.shape[1]
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    batch, heads, _, dv = v.shape
    pad = (chunk - steps % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    terms = _chunk_terms(q, k, v, g, beta, chunk)
    out, s = chunk_scan(*terms, state.to(terms[2]))
    out = out.reshape(batch, heads, -1, dv)[:, :, :steps]  # (B, Hv, T, Dv)
    return out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format), s


def _chunk_terms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunk scan's inputs (:func:`chunk_scan`'s arguments but the state) from prepared ``q, k``
    ``(B, H, T, Dk)``, ``v`` ``(B, H, T, Dv)``, ``g, beta`` ``(B, H, T)``, ``T`` a multiple of ``chunk``:
    each chunk's UT transform, all of them at once."""
    batch, heads = q.shape[:2]
    v_beta = v * beta[..., None]
    k_beta = k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(batch, heads, -1, chunk, x.shape[-1])
                            for x in (q, k, k_beta, v_beta))  # (B, Hv, N, C, D)
    g = g.reshape(batch, heads, -1, chunk)  # (B, Hv, N, C)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)

    cum = g.cumsum(dim=-1)  # log decay from the chunk start to each position
    pair = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()  # (B, Hv, N, C, C)
    ut_system = (k_beta @ k.transpose(-1, -2)) * pair
    intra = (q @ k.transpose(-1, -2)) * pair
    decayed_k_beta = k_beta * cum.exp()[..., None]
    # UT transform: solve the unit lower-triangular system instead of C sequential updates
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, decayed_k_beta, upper=False, unitriangular=True)

    q = q * cum.exp()[..., None]
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    return q, k, new_values, k_cumdecay, intra, cum[..., -1].exp()


def chunk_scan(q: torch.Tensor, k: torch.Tensor, new_values: torch.Tensor, k_cumdecay: torch.Tensor,
               intra: torch.Tensor, chunk_decay: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequential part of the chunked rule: carry the state across the ``N`` chunks.

    Args (float32, ``C`` tokens per chunk): q (decayed), k (decayed to the chunk end), k_cumdecay
        ``(B, H, N, C, Dk)``; new_values ``(B, H, N, C, Dv)``; intra ``(B, H, N, C, C)``;
        chunk_decay ``(B, H, N)``; state ``(B, H, Dk, Dv)`` before the first chunk.
    Returns:
        per-token outputs ``(B, H, N, C, Dv)`` and the state after the last chunk.
    """
    s = state  # (B, H, Dk, Dv)
    out = torch.zeros_like(new_values)  # (B, H, N, C, Dv)
    decay = chunk_decay[..., None, None]  # (B, H, N, 1, 1)
    for i in range(q.shape[2]):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ s  # (B, H, C, Dv)
        out[:, :, i] = q[:, :, i] @ s + intra[:, :, i] @ v_new
        s = s * decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    return out, s


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`chunked_gated_delta_rule`, one token at a time (decode)."""
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    s = state.to(v)  # (B, Hv, Dk, Dv)
    out = torch.zeros_like(v)  # (B, Hv, T, Dv)
    for t in range(q.shape[2]):
        s = s * g[:, :, t].exp()[..., None, None]
        memory = (s * k[:, :, t, :, None]).sum(dim=-2)  # (B, Hv, Dv): what S predicts for k_t
        delta = (v[:, :, t] - memory) * beta[:, :, t, None]
        s = s + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, :, t] = (s * q[:, :, t, :, None]).sum(dim=-2)
    return out.transpose(1, 2).contiguous().to(dtype), s


def packed_chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: DecayGates,
                                    pool: torch.Tensor, segments: PackedSegments,
                                    out: torch.Tensor | None = None) -> torch.Tensor:
    """The gated delta rule over a packed step's prompt segments, state read and written by index.

    Args:
        q, k: ``(N, Hk, Dk)``; v: ``(N, Hv, Dv)``: the step's tokens (last dims contiguous; strided token
            and head dims allowed); gates: their ``(N, Hv)`` gate inputs (evaluated where they are read).
        pool: recurrent state entries ``(E, Hv, Dk, Dv)`` float32. Segment ``s`` starts from entry
            ``segments.read[s]``; its final state is written to entry ``segments.write[s]`` and, where
            ``segments.snap_at[s] > 0``, the state after that many of its tokens to ``segments.snap[s]``.
            No other entry is touched.
        out: ``(N, Hv, Dv)`` to write the segments' tokens into (allocated when None; tokens outside
            every segment are left as they are).
    Returns:
        ``out``: every segment token's readout, in ``q``'s dtype.

    Each segment runs in :data:`CHUNK`-token chunks from its first token, the last one zero-padded as
    :func:`chunked_gated_delta_rule` pads it. A chunk's result depends only on its tokens and the
    state before it: one call over a prompt, or several at chunk boundaries carrying the state through
    entries (or a snapshot), agree bit for bit, on this path and on the Triton path (``use_triton``).
    """
    if use_triton(q):
        from stagewise.kernels.deltanet_packed_triton import packed_gated_delta_rule_triton

        return packed_gated_delta_rule_triton(q, k, v, gates, pool, segments, out)
    return packed_chunked_gated_delta_rule_reference(q, k, v, gates, pool, segments, out)


def packed_chunked_gated_delta_rule_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: DecayGates,
                                              pool: torch.Tensor, segments: PackedSegments,
                                              out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`packed_chunked_gated_delta_rule`'s torch path, on any device (a Python loop over chunks)."""
    beta, g = gates.values()
    heads, dv = v.shape[1], v.shape[2]
    if out is None:
        out = torch.empty((q.shape[0], heads, dv), dtype=q.dtype, device=q.device)
    offsets = segments.offsets
    for s in range(segments.count):
        state = pool.index_select(0, segments.read[s : s + 1])  # (1, Hv, Dk, Dv)
        for lo in range(offsets[s], offsets[s + 1], CHUNK):
            hi = min(lo + CHUNK, offsets[s + 1])
            # one chunk at a time, padded to CHUNK tokens: the same shapes whatever shares the call
            chunk = [F.pad(x[lo:hi], (0, 0) * (x.dim() - 1) + (0, CHUNK - (hi - lo)))[None]
                     for x in (q, k, v, g, beta)]  # (1, C, H, D) and (1, C, Hv)
            terms = _chunk_terms(*_prepare(*chunk), CHUNK)  # (1, Hv, 1, C, ...)
            readout, state = chunk_scan(*terms, state)
            out[lo:hi] = readout[0, :, 0, : hi - lo].transpose(0, 1).to(out.dtype)  # (n, Hv, Dv)
            if hi - offsets[s] == segments.snap_tokens[s]:
                pool.index_put_((segments.snap[s : s + 1],), state)
        pool.index_put_((segments.write[s : s + 1],), state)
    return out


def packed_recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: DecayGates,
                          pool: torch.Tensor, read: torch.Tensor, write: torch.Tensor) -> torch.Tensor:
    """One token of each of ``B`` decoding rows, state read and written by index (torch reference;
    on the Triton path ``deltanet_decode_triton.delta_step`` computes the same from the gates' inputs).

    Args:
        q, k: ``(B, Hk, Dk)``; v: ``(B, Hv, Dv)``; gates: their ``(B, Hv)`` gate inputs.
        pool: ``(E, Hv, Dk, Dv)`` float32; read, write: ``(B,)`` int32 entries (row ``b`` reads entry
            ``read[b]`` and writes its new state to entry ``write[b]``; no entry both read and written).
    Returns:
        ``(B, Hv, Dv)`` readout in ``q``'s dtype.
    """
    beta, g = gates.values()
    state = pool.index_select(0, read)  # (B, Hv, Dk, Dv)
    out, state = recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], state)
    pool.index_put_((write,), state)
    return out[:, 0]
