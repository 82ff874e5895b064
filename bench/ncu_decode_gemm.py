"""One batched-decode MoE GEMM launch (Qwen3-30B-A3B gate_up, 32 tokens, Q8_0) for Nsight Compute.

    ncu --clock-control none --kernel-name regex:_decode_gemm --launch-skip 3 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats python3 bench/ncu_decode_gemm.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.kernels.moe_align_triton import moe_align_fused
from stagewise.kernels.moe_decode_triton import decode_gemm
from stagewise.kernels.moe_grouped_triton import DECODE_Q8_0
from stagewise.weights.quant.q8_0 import Q8_0Weight

E, K, H, INTER, TOKENS = 128, 8, 2048, 768, 32
dev = torch.device("cuda")
torch.manual_seed(0)
qs = torch.randint(-127, 128, (E, 2 * INTER, H), dtype=torch.int8, device=dev)
scales = (torch.rand(E, 2 * INTER, H // 32, device=dev) * 1e-3).to(torch.float16)
x = torch.randn(TOKENS, H, device=dev).to(torch.bfloat16)
top_index = torch.topk(torch.rand(TOKENS, E, device=dev), K, dim=-1).indices.to(torch.int32)
align = moe_align_fused(top_index, E, DECODE_Q8_0.block_m)
for _ in range(5):
    decode_gemm(x, Q8_0Weight(qs, scales), align, K, DECODE_Q8_0.gate_up, gather_rows=True)
torch.cuda.synchronize()
print("used experts", int(torch.unique(top_index).numel()))
