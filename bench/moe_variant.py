"""Run a command with the batched-decode tiles of the Q8_0 kernels replaced: an A/B tool.

    python3 bench/moe_variant.py VARIANT bench/profile_batch.py random:qwen3-30b-a3b@q8_0 --streams 32
    python3 bench/moe_variant.py VARIANT -m stagewise bench random:qwen3-30b-a3b@q8_0 --concurrency 32 ...

VARIANT (``+``-joined): ``default``; ``gemv64`` (dense Q8_0 matmuls of up to 64 rows through the
GEMV); ``experts=BN,BK,WARPS,STAGES[,SWAP,TMA[,SPLIT_K[,WIDE]]]`` (both MoE decode GEMMs' tiles, flags 0/1),
``gate_up=…`` / ``down=…`` (one of them); ``nofuse`` (SiLU·up as its own launch); ``dense=…`` (the
dense 17-64-row Q8_0 tiles, K split as before); ``head=…`` (those of outputs as wide as a head); ``nopack`` (one prompt per prefill step: no packed
prefill); ``rectangles`` (prompts prefilled in rectangle steps between decode steps, as before packed
steps beside the decoding rows); ``oldexperts`` (the MoE experts of batched decode through the prefill grouped GEMM's
16-row blocks, as before the decode kernel).
"""

from __future__ import annotations

import dataclasses
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stagewise.engine.staging_area as staging
import stagewise.kernels.moe_grouped_triton as grouped
import stagewise.kernels.q8_0_gemm as q8_gemm
import stagewise.weights.quant.q8_0 as q8
from stagewise.kernels.moe_decode_triton import DecodeTiles
from stagewise.runtime.pipeline import Pipeline


def _tiles(spec: str) -> DecodeTiles:
    values = [int(v) for v in spec.split(",")]
    bn, bk, warps, stages = values[:4]
    swap, tma = (bool(v) for v in [*values[4:], 0, 0][:2])
    split = values[6] if len(values) > 6 else 1
    wide = bool(values[7]) if len(values) > 7 else False
    return DecodeTiles(bn, bk, warps, stages, split_k=split, swap=swap, tma=tma, wide=wide)


def apply(variant: str) -> None:
    for part in variant.split("+"):
        if part == "default":
            continue
        if part == "gemv64":
            q8.GEMV_MAX_TOKENS = 64
        elif part.startswith("experts="):
            tiles = _tiles(part.split("=", 1)[1])
            grouped.DECODE_Q8_0 = dataclasses.replace(grouped.DECODE_Q8_0, gate_up=tiles, down=tiles)
        elif part.startswith(("gate_up=", "down=")):
            name, spec = part.split("=", 1)
            cfg = grouped.DECODE_Q8_0
            tiles = _tiles(spec)
            grouped.DECODE_Q8_0 = dataclasses.replace(cfg, gate_up=tiles) if name == "gate_up" else \
                dataclasses.replace(cfg, down=tiles)
        elif part == "nopack":  # one prompt per prefill step, as before packed prefill
            staging.StagingArea.accepts = lambda self, left: not self.members  # type: ignore[method-assign]
        elif part == "rectangles":  # no packed steps: prefill rectangles between decode steps
            Pipeline.packed_steps = property(lambda self: False)  # type: ignore[method-assign,assignment]
        elif part == "oldexperts":
            grouped.DECODE_Q8_0 = grouped.GroupedConfig(16, grouped.TILES_DECODE, grouped.TILES_DECODE)
        elif part == "nofuse":
            grouped.DECODE_Q8_0 = dataclasses.replace(grouped.DECODE_Q8_0, fuse_silu=False)
        elif part.startswith("dense="):
            q8_gemm.DENSE_DECODE_TILES = _tiles(part.split("=", 1)[1])
        elif part.startswith("head="):
            q8_gemm.WIDE_DECODE_TILES = _tiles(part.split("=", 1)[1])
        else:
            raise SystemExit(f"unknown variant {part!r}")


if __name__ == "__main__":
    apply(sys.argv[1])
    rest = sys.argv[2:]
    if rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")
