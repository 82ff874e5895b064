"""DecayGates: what a Gated DeltaNet step's gates are computed from, handed to the delta rule unevaluated.

Per token and value head the rule takes a write strength ``beta = sigmoid(b)`` (kept in the activation
dtype, as the reference keeps it) and a log decay ``g = -exp(A_log) * softplus(a + dt_bias)`` (float32,
<= 0). The Triton kernels compute both where they read them (no torch op per gate a layer); the torch
path evaluates :meth:`DecayGates.values` first. One formula, written once here for the torch path and
mirrored by the kernels (``deltanet_packed_triton``, ``deltanet_decode_triton``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SOFTPLUS_LINEAR_ABOVE = 20.0  # softplus(x) = x past this (torch's threshold)


@dataclass(frozen=True)
class DecayGates:
    """``b``, ``a`` ``(N, Hv)`` in the activation dtype (last dim contiguous); ``a_log``, ``dt_bias`` ``(Hv,)``."""

    b: torch.Tensor
    a: torch.Tensor
    a_log: torch.Tensor
    dt_bias: torch.Tensor

    def __post_init__(self) -> None:
        heads = self.a_log.shape[-1]
        if self.b.shape != self.a.shape or self.b.dim() != 2 or self.b.shape[1] != heads \
                or self.a_log.shape != (heads,) or self.dt_bias.shape != (heads,):
            raise ValueError(f"gates: b {tuple(self.b.shape)}, a {tuple(self.a.shape)}, A_log {tuple(self.a_log.shape)}, "
                             f"dt_bias {tuple(self.dt_bias.shape)} are not (N, Hv) twice and (Hv,) twice")

    def rows(self, lo: int, hi: int) -> DecayGates:
        """The gates of tokens ``lo .. hi - 1``."""
        return DecayGates(self.b[lo:hi], self.a[lo:hi], self.a_log, self.dt_bias)

    def values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``beta`` (activation dtype) and ``g`` (float32), ``(N, Hv)``.

        NOTE: sigmoid and softplus written with exp and log: on the CPU, torch's vectorized sigmoid and
        softplus may round an element differently by where it lies in the tensor (exp and log do not), and
        a token's gates must not depend on which step carries it (a cached prompt = a cold one, bit for bit)."""
        b, a = self.b, self.a
        beta = torch.reciprocal(1.0 + torch.exp(-b.float())).to(b.dtype)
        shifted = a.float() + self.dt_bias
        softplus = torch.where(shifted > SOFTPLUS_LINEAR_ABOVE, shifted,
                               torch.log(1.0 + torch.exp(shifted.clamp(max=SOFTPLUS_LINEAR_ABOVE))))
        return beta, -self.a_log.float().exp() * softplus
