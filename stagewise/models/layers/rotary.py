"""Rotary position embeddings (default, llama3-scaled or per-frequency factors), computed as the reference does."""

from __future__ import annotations

import math

import torch

from stagewise.errors import ConfigError
from stagewise.spec.model_config import RopeScaling


def inverse_frequencies(rope: RopeScaling, rotary_dim: int) -> torch.Tensor:
    """Float32 inverse frequencies ``(rotary_dim // 2,)`` with llama3 scaling or the file's
    per-frequency factors applied if asked."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "factors":  # llama.cpp's rope_freqs: each inverse frequency over its factor
        factors = torch.tensor(rope.freq_factors, dtype=torch.float32)
        if factors.numel() != inv_freq.numel():
            raise ConfigError(f"rope_freqs holds {factors.numel()} factors for {inv_freq.numel()} rotary frequencies")
        return inv_freq / factors
    if rope.rope_type != "llama3":
        return inv_freq
    low_freq_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_freq_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotary_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape ``(B, T, rotary_dim)`` for integer ``positions`` ``(B, T)``."""
    freqs = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)  # (B, T, rd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, rd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of ``x`` ``(B, H, T, D)``; the rest pass through."""
    rd = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, rd)
    if rd == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)
