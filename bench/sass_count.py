"""Compile the packed few-rows GEMM (kernels A and B), the packed GEMVs and the Q8_0 GEMV for sm_90a offline and count
their SASS: no GPU needed.

For each case: registers, local-memory stack (spills), shared memory, the instructions of the K loop's
body (the largest backward branch) and those per weight value and thread (the loop's body handles one
K step of ``block_n`` weight rows over ``32 * num_warps`` threads), with the body's commonest opcodes.
Triton ships ``ptxas`` and ``cuobjdump``; the kernel is compiled exactly as a launch on an H200 would
compile it (``GPUTarget("cuda", 90, 32)``), so this checks that every type compiles, and counts what
an H200 would issue, before any device time is spent.

    PYTHONPATH=. python3 bench/sass_count.py --types q4_k,q6_k --modes A,B [--json out.json]
    PYTHONPATH=. python3 bench/sass_count.py --modes Q    # the Q8_0 GEMV
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # NOTE: compiled kernels, before any kernel module is imported
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch
import triton
from gguf.constants import GGMLQuantizationType
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.kernels.packed_decode_triton import _packed_decode_kernel
from stagewise.kernels.packed_gemv_triton import SLOT_TYPES, _packed_gemv_kernel, config_for
from stagewise.kernels.word_gemv_triton import _words_kernel, row_threads, words_config
from stagewise.spec.packed_types import block_elements

T = GGMLQuantizationType
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")


def compile_sm90a(fn: Any, sig: dict[str, str], consts: dict[str, object], aligned: set[str], num_warps: int,
                  num_stages: int) -> Any:
    """``fn`` compiled for sm_90a as a launch with these argument types (``sig``; the rest ``consts``) specializes it,
    the arguments named in ``aligned`` 16-divisible (pointers 16-byte aligned, sizes and strides multiples of 16)."""
    order = list(fn.arg_names)
    signature = {name: sig.get(name, "constexpr") for name in order}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(order) if name in aligned}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages})


def compile_case(ggml_type: GGMLQuantizationType, scale_after: bool, block_m: int, block_n: int, num_warps: int,
                 num_stages: int, split_k: int = 1, glu: bool = False, blocks: int = 8) -> tuple[bytes, float]:
    """The cubin of one kernel configuration (bf16 activations, compiled for sm_90a) and its compile seconds."""
    sig = {name: "*u8" for name in ("qs_ptr", "qh_ptr", "meta_ptr")}
    sig |= {"a_ptr": "*bf16", "out_ptr": "*bf16", "route_ptr": "*bf16", "part_ptr": "*fp32", "lock_ptr": "*i32",
            "sorted_ptr": "*i32", "block_expert_ptr": "*i32", "valid_ptr": "*i32"}
    sig |= {name: "i32" for name in ("N", "steps", "num_slots", "top_k", "up_offset", "split_k", "stride_am", "stride_qe",
                                     "stride_qn", "stride_he", "stride_hn", "stride_me", "stride_mn", "stride_om")}
    consts = {"TYPE": int(ggml_type), "BLOCKS": 1 if block_elements(ggml_type) == 256 else blocks,
              "SCALE_AFTER": scale_after, "DOT": 1, "ASM": True, "GATHER_ROWS": False, "ROUTE_WEIGHT": False, "GLU": glu,
              "SPLIT": split_k > 1, "BLOCK_M": block_m, "BLOCK_N": block_n, "GDC": False}
    # as a launch at Llama-3.1-8B's shapes specializes: every pointer 16-byte aligned, N and the strides multiples of 16
    aligned = {name for name, kind in sig.items() if kind.startswith("*") or name == "N" or name.startswith("stride")}
    started = time.perf_counter()
    kernel = compile_sm90a(_packed_decode_kernel, sig, consts, aligned, num_warps, num_stages)
    return kernel.asm["cubin"], time.perf_counter() - started


def compile_gemv_case(ggml_type: GGMLQuantizationType, n: int, k: int, words: bool = True) -> tuple[bytes, float, dict]:
    """The cubin of the packed GEMV of an ``(n, k)`` matrix (one output row: single-stream decode; the word GEMV
    where :func:`words_config` has a config for bf16 input and ``words`` is True, else the slot or byte path),
    compiled for sm_90a as a launch at these shapes specializes it (pointers, N, K and strides 16-divisible), and
    its config."""
    sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "qs_ptr": "*u8", "qh_ptr": "*u8", "meta_ptr": "*u8",
           "meta32_ptr": "*i32", "e_ptr": "*i32"}
    sig |= {name: "i32" for name in ("N", "K", "stride_xm", "stride_qe", "stride_qn", "stride_he", "stride_hn",
                                     "stride_me", "stride_mn", "stride_ym")}
    config = words_config(ggml_type, k, False, torch.bfloat16) if words else None
    slots = ggml_type in SLOT_TYPES
    if config is not None:
        fn, (block_n, block_k, warps), stages = _words_kernel, config, 1
        consts = {"TYPE": int(ggml_type), "GATHER": False, "BLOCK_N": block_n, "BLOCK_K": block_k,
                  "ROW_THREADS": row_threads(block_k), "ASM": True, "GDC": False, "x_repeat": 1}
    else:
        fn = _packed_gemv_kernel
        block_n, block_k, warps, stages = config_for(ggml_type, n, k, gather=False)
        consts = {"TYPE": int(ggml_type), "SLOTS": slots, "GATHER": False, "BLOCK_N": block_n, "BLOCK_K": block_k,
                  "GDC": False, "x_repeat": 1}
    started = time.perf_counter()
    kernel = compile_sm90a(fn, sig, consts, set(sig) - {"stride_qe", "stride_he", "stride_me"}, warps, stages)
    path = "words" if config else ("slots" if slots else "bytes")
    return kernel.asm["cubin"], time.perf_counter() - started, {"path": path, "block_n": block_n, "block_k": block_k,
                                                                "warps": warps, "stages": stages}


def q8_0_gemv_rows() -> list[dict[str, object]]:
    """The Q8_0 GEMV (one program per output row and column tile) at each of its configs, counted and printed: a
    decode step of M rows issues M times these instructions per weight value."""
    from stagewise.kernels.q8_0_gemv_triton import HEAD_CONFIG, ROW_CONFIG, TALL_CONFIG, _q8_0_gemv_kernel

    sig = {"x_ptr": "*bf16", "q_ptr": "*i8", "s_ptr": "*fp16", "y_ptr": "*bf16", "e_ptr": "*i32"}
    sig |= {name: "i32" for name in ("N", "K", "stride_xm", "stride_qe", "stride_qn", "stride_se", "stride_sn",
                                     "stride_ym", "x_repeat")}
    aligned = set(sig) - {"stride_qe", "stride_se", "x_repeat"}
    rows = []
    for name, (block_n, block_k, warps, stages) in (("head", HEAD_CONFIG), ("tall", TALL_CONFIG), ("row", ROW_CONFIG)):
        consts = {"GATHER": False, "BLOCK_N": block_n, "BLOCK_K": block_k, "GDC": False}
        kernel = compile_sm90a(_q8_0_gemv_kernel, sig, consts, aligned, warps, stages)
        report = sass_report(kernel.asm["cubin"])
        per_value = int(report["loop_instructions"]) / (block_n * block_k / (32 * warps))  # type: ignore[call-overload]
        print(f"Q8_0   Q {name} BN{block_n} BK{block_k} w{warps}: {report['registers']} regs, loop "
              f"{report['loop_instructions']} = {per_value:.2f} a value a thread, one row | {report['top_ops']}", flush=True)
        rows.append({"type": "Q8_0", "mode": "Q", "config": name, "block_n": block_n, "block_k": block_k, "warps": warps,
                     "per_value": round(per_value, 2), **report})
    return rows


def sass_report(cubin: bytes) -> dict[str, object]:
    """Registers, stack, shared memory, and the K loop body's instruction count and opcodes."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([str(CUOBJDUMP), "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(CUOBJDUMP), "-sass", f.name], capture_output=True, text=True).stdout
    instructions = []  # (address, text)
    for line in sass.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            instructions.append((int(m.group(1), 16), m.group(2).strip()))
    body: list[str] = []
    for addr, text in instructions:  # the largest backward branch is the K loop
        target = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        if target and target.group(1) and int(target.group(1), 16) < addr:
            start = int(target.group(1), 16)
            span = [t for a, t in instructions if start <= a <= addr]
            if len(span) > len(body):
                body = span
    ops: dict[str, int] = {}
    for text in body:
        op = text.split()[1] if text.startswith("@") else text.split()[0]
        op = op.split(".")[0]
        ops[op] = ops.get(op, 0) + 1
    use = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)", usage)
    regs, stack, shared = (int(v) for v in use.groups()) if use else (0, 0, 0)
    return {"registers": regs, "stack_bytes": stack, "shared_bytes": shared, "loop_instructions": len(body),
            "top_ops": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:12])}


def gemv_row(qtype: GGMLQuantizationType, n: int, k: int, words: bool) -> dict[str, object]:
    """One GEMV case counted and printed: the loop handles ``block_n * block_k`` values over the program's threads."""
    cubin, seconds, config = compile_gemv_case(qtype, n, k, words)
    report = sass_report(cubin)
    sets = row_threads(int(config["block_k"])) if config["path"] == "words" else 1
    values = sets * int(config["block_n"]) * int(config["block_k"]) / (32 * int(config["warps"]))
    per_value = int(report["loop_instructions"]) / values  # type: ignore[call-overload]
    print(f"{qtype.name:6s} G {config['path']} N{n} K{k} BN{config['block_n']} BK{config['block_k']} w{config['warps']}: "
          f"{report['registers']} regs, stack {report['stack_bytes']}, loop {report['loop_instructions']} = "
          f"{per_value:.2f} a value a thread | {report['top_ops']}", flush=True)
    return {"type": qtype.name, "mode": "G", "n": n, "k": k, **config, "compile_s": round(seconds, 1),
            "per_value": round(per_value, 2), **report}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="q4_k,q5_k,q6_k,iq4_xs,q4_0")
    ap.add_argument("--modes", default="A,B", help="A: kernel A at 16 rows; B: kernel B at 64 rows; "
                    "G: the packed GEMV at one row (Llama-3.1-8B's gate/up and down, Qwen3.6's expert down); "
                    "Q: the Q8_0 GEMV's configs (--types is then ignored)")
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--glu", action="store_true")
    ap.add_argument("--block-m", type=int, default=0, help="rows a block (default: 16 for A, 64 for B)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    modes = args.modes.split(",")
    packed_modes = [mode for mode in modes if mode != "Q"]
    rows = q8_0_gemv_rows() if "Q" in modes else []
    for name in args.types.split(",") if packed_modes else ():
        qtype = T[name.strip().upper()]
        for mode in packed_modes:
            if mode == "G":  # Llama-3.1-8B gate/up and down, Qwen3.6 expert down: the word GEMV and the former one
                for n, k in ((14336, 4096), (4096, 14336), (2048, 512)):
                    rows.extend(gemv_row(qtype, n, k, words) for words in (True, False)
                                if not words or words_config(qtype, k, False, torch.bfloat16))
                continue
            block_m = args.block_m or (16 if mode == "A" else 64)
            cubin, seconds = compile_case(qtype, mode == "A", block_m, args.block_n, args.warps, args.stages,
                                          glu=args.glu)
            report = sass_report(cubin)
            values_per_thread = 256 * args.block_n * (2 if args.glu else 1) / (32 * args.warps)
            per_value = int(report["loop_instructions"]) / values_per_thread  # type: ignore[call-overload]
            row = {"type": qtype.name, "mode": mode, "block_m": block_m, "block_n": args.block_n, "warps": args.warps,
                   "stages": args.stages, "compile_s": round(seconds, 1), "per_value": round(per_value, 2), **report}
            rows.append(row)
            print(f"{qtype.name:6s} {mode} BM{block_m:<3d} BN{args.block_n} w{args.warps}: {report['registers']} regs, "
                  f"stack {report['stack_bytes']}, loop {report['loop_instructions']} = {per_value:.2f} a value a thread "
                  f"| {report['top_ops']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": "python3 " + " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
