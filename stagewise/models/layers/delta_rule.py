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
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from stagewise.kernels.triton_launch import use_triton

CHUNK = 64  # the reference's chunk size


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> tuple[torch.Tensor, ...]:
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
    scan = chunk_scan
    if use_triton(q):
        from stagewise.kernels.delta_rule_scan_triton import chunk_scan_triton as scan
    out, s = scan(q, k, new_values, k_cumdecay, intra, cum[..., -1].exp(), state.to(new_values))
    out = out.reshape(batch, heads, -1, dv)[:, :, :steps]  # (B, Hv, T, Dv)
    return out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format), s


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
