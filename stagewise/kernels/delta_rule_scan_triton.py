"""The chunked delta rule's sequential scan (Gated DeltaNet prefill) as one Triton launch.

Same contract as :func:`stagewise.models.layers.delta_rule.chunk_scan`, whose torch loop issues ~8
operations per 64-token chunk (256 per layer for a 2,048-token prompt: prefill of the hybrids is
host-bound on that loop, ``bench/results/profile_prefill_qwen36.json``). One program owns one
(sequence, head) and ``block_v`` value columns; it keeps that slice of the state in registers and
walks the chunks in order, all in float32 (``tl.dot`` with IEEE precision).

``chunked_gated_delta_rule`` calls it on the Triton path. Checked against the torch loop under
Triton's interpreter (``tests/test_triton_kernels.py``) and on a GPU (``bench/delta_rule_scan.py``).
The loop is not software-pipelined (``num_stages=1``): the float32 operands of its four ``tl.dot``
already take ~140 KB of shared memory, and multi-buffering them overflows an H200's 227 KB.
16 value columns per program (256 programs for 32 heads of 128): 2.3x / 1.9x faster than the torch
loop at 512 / 2,048 tokens, where 32 columns were 2x slower (``bench/results/delta_rule_scan_h200.json``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.triton_launch import launch_device


@triton.jit
def _chunk_scan_kernel(
    q_ptr, k_ptr, u_ptr, w_ptr, a_ptr, d_ptr, s0_ptr, o_ptr, sn_ptr,
    chunks, dk, dv,
    C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    bh = tl.program_id(0)  # (sequence, head)
    offs_c = tl.arange(0, C)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = offs_k < dk
    v_ok = offs_v < dv
    state_tile = offs_k[:, None] * dv + offs_v[None, :]
    state_ok = k_ok[:, None] & v_ok[None, :]
    s = tl.load(s0_ptr + bh * dk * dv + state_tile, mask=state_ok, other=0.0)  # (BK, BV)
    ck_tile = offs_c[:, None] * dk + offs_k[None, :]  # a (C, Dk) chunk of q, k or k_cumdecay
    cv_tile = offs_c[:, None] * dv + offs_v[None, :]  # a (C, Dv) chunk of values or outputs
    cc_tile = offs_c[:, None] * C + offs_c[None, :]
    for i in range(chunks):
        chunk = bh * chunks + i
        w = tl.load(w_ptr + chunk * C * dk + ck_tile, mask=k_ok[None, :], other=0.0)  # (C, BK)
        u = tl.load(u_ptr + chunk * C * dv + cv_tile, mask=v_ok[None, :], other=0.0)  # (C, BV)
        v_new = u - tl.dot(w, s, input_precision="ieee")  # (C, BV)
        q = tl.load(q_ptr + chunk * C * dk + ck_tile, mask=k_ok[None, :], other=0.0)
        a = tl.load(a_ptr + chunk * C * C + cc_tile)  # (C, C)
        out = tl.dot(q, s, input_precision="ieee") + tl.dot(a, v_new, input_precision="ieee")
        tl.store(o_ptr + chunk * C * dv + cv_tile, out, mask=v_ok[None, :])
        k = tl.load(k_ptr + chunk * C * dk + ck_tile, mask=k_ok[None, :], other=0.0)
        decay = tl.load(d_ptr + chunk)
        s = s * decay + tl.dot(tl.trans(k), v_new, input_precision="ieee")  # (BK, BV)
    tl.store(sn_ptr + bh * dk * dv + state_tile, s, mask=state_ok)


def chunk_scan_triton(q: torch.Tensor, k: torch.Tensor, new_values: torch.Tensor, k_cumdecay: torch.Tensor,
                      intra: torch.Tensor, chunk_decay: torch.Tensor,
                      state: torch.Tensor, block_v: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~stagewise.models.layers.delta_rule.chunk_scan` in one launch (float32 inputs)."""
    batch, heads, chunks, c, dk = q.shape
    dv = new_values.shape[-1]
    q, k, new_values, k_cumdecay, intra = (t.contiguous() for t in (q, k, new_values, k_cumdecay, intra))
    chunk_decay, state = chunk_decay.contiguous(), state.contiguous()
    out = torch.empty_like(new_values)
    final = torch.empty_like(state)
    block_v = min(block_v, triton.next_power_of_2(dv))
    with launch_device(q):
        _chunk_scan_kernel[(batch * heads, triton.cdiv(dv, block_v))](
            q, k, new_values, k_cumdecay, intra, chunk_decay, state, out, final, chunks, dk, dv,
            C=c, BLOCK_K=max(16, triton.next_power_of_2(dk)), BLOCK_V=block_v, num_warps=4, num_stages=1,
        )
    return out, final
