"""Run a ``stagewise`` command with the dense GEMV's rule for tall matrices (q/k/v, gate_up) replaced.

An A/B tool for decode: the rule (``stagewise.kernels.gemv_triton.config_for``) decides which of
cuBLAS and our GEMV runs each matrix; this swaps in another rule for one run, so variants can be
benched back to back on one machine.

    python3 bench/gemv_variant.py VARIANT bench random:llama-3.1-8b --devices cuda:0 --json ...

VARIANT: ``default`` (the rule as shipped), ``cublas`` (tall matrices to cuBLAS), ``row`` (tall
matrices through the row config), or ``BN,BK,WARPS,STAGES`` (tall matrices through that config).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stagewise.kernels.gemv_triton as gemv_triton
from stagewise.cli.main import main

Config = tuple[int, int, int, int]


def tall_rule(tall: Config | None) -> object:
    """``config_for`` with ``tall`` (None: cuBLAS) for every tall matrix, whatever the launch mode."""
    shipped = gemv_triton.config_for

    def config_for(n: int, k: int, overlapped: bool = False) -> Config | None:
        if n * k < gemv_triton.HEAD_MIN_ELEMENTS and n >= gemv_triton.TALL_MIN_ROWS and n > k:
            return tall
        return shipped(n, k, overlapped)

    return config_for


if __name__ == "__main__":
    variant, argv = sys.argv[1], sys.argv[2:]
    if variant == "cublas":
        gemv_triton.config_for = tall_rule(None)  # type: ignore[assignment]
    elif variant == "row":
        gemv_triton.config_for = tall_rule(gemv_triton.ROW_CONFIG)  # type: ignore[assignment]
    elif variant != "default":
        block_n, block_k, warps, stages = (int(v) for v in variant.split(","))
        gemv_triton.config_for = tall_rule((block_n, block_k, warps, stages))  # type: ignore[assignment]
    sys.exit(main(argv))
