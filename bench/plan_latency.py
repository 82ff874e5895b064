"""CLI latency of the metadata-only commands (issue #36): each call < 0.5 s median, a 20-model catalog < 2 s.

Times ``stagewise plan`` / ``assess`` / ``devices --devices SPEC`` as a user runs them (a fresh
``python -m stagewise`` process per call, 10 runs, median) for every MODEL kind: a config.json
(bf16, ``--format q8_0``, ``--format q4_k_m``), an HF directory, GGUF files (Q8_0 and Q4_0), a
split GGUF, ``random:PRESET@q4_k`` and a catalog directory of 20 models. Models are made first
with ``make-model`` (tiny presets; needs torch once, outside the timing). Each row also records
whether torch was imported (``-X importtime``). Prints a table and writes
``bench/results/plan_latency.json`` with the command, machine and date.

Run: ``PYTHONPATH=. .venv/bin/python bench/plan_latency.py [--runs 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REF = Path("/work/shared/reference")
PRESETS = ROOT / "stagewise" / "assets" / "presets"
TARGET_S, CATALOG_TARGET_S = 0.5, 2.0


def _make_models(root: Path) -> dict[str, Path]:
    from stagewise.weights.make_model import make_model

    out = {
        "hf_dir": Path(make_model("tiny-llama", root / "hf", "safetensors", "bf16", seed=0)),
        "gguf_q8_0": Path(make_model("tiny-qwen3-moe", root / "moe-q8_0.gguf", "gguf", "q8_0", seed=0)),
        "gguf_q4_0": Path(make_model("tiny-qwen3-moe", root / "moe-q4_0.gguf", "gguf", "q4_0", seed=0)),
    }
    make_model("tiny-llama", root / "split" / "llama.gguf", "gguf", "q8_0", seed=0, split_max_bytes=100_000)
    out["gguf_split"] = sorted((root / "split").glob("*-00001-of-*.gguf"))[0]
    catalog = root / "catalog"
    catalog.mkdir()
    sources = sorted(PRESETS.glob("*.json")) + sorted((REF / "models").glob("*.json"))
    for i in range(17):  # 17 configs + 2 GGUF + 1 HF directory = 20 models
        shutil.copy(sources[i % len(sources)], catalog / f"{i:02d}-{sources[i % len(sources)].name}")
    shutil.copy(out["gguf_q8_0"], catalog / "moe-q8_0.gguf")
    shutil.copy(out["gguf_q4_0"], catalog / "moe-q4_0.gguf")
    shutil.copytree(out["hf_dir"], catalog / "hf")
    out["catalog"] = catalog
    return out


def _cases(m: dict[str, Path]) -> list[tuple[str, list[str], float]]:
    config = str(REF / "models" / "llama-3.1-70b.json")
    seed = str(REF / "topologies" / "seed-2x3090-pcie.json")
    four = str(REF / "topologies" / "4x24-3090.json")
    cpu = "cpu:2x1GiB"
    return [
        ("plan config.json bf16", ["plan", config, "--devices", four, "--json"], TARGET_S),
        ("plan config.json q8_0", ["plan", config, "--format", "q8_0", "--devices", four, "--json"], TARGET_S),
        ("assess config.json q4_k_m", ["assess", str(REF / "models" / "qwen3.6-35b-a3b.json"), "--format", "q4_k_m",
                                       "--devices", seed], TARGET_S),
        ("plan HF directory", ["plan", str(m["hf_dir"]), "--devices", cpu, "--json"], TARGET_S),
        ("assess GGUF q8_0", ["assess", str(m["gguf_q8_0"]), "--devices", cpu], TARGET_S),
        ("plan GGUF q4_0", ["plan", str(m["gguf_q4_0"]), "--devices", cpu, "--json"], TARGET_S),
        ("plan split GGUF", ["plan", str(m["gguf_split"]), "--devices", cpu, "--json"], TARGET_S),
        ("assess random:tiny-qwen3-moe@q4_k", ["assess", "random:tiny-qwen3-moe@q4_k", "--devices", cpu], TARGET_S),
        ("devices --devices 24GiB,12GiB", ["devices", "--devices", "24GiB,12GiB"], TARGET_S),
        ("assess catalog (20 models)", ["assess", str(m["catalog"]), "--devices", four], CATALOG_TARGET_S),
    ]


def _time(argv: list[str], runs: int) -> tuple[float, bool]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "stagewise", *argv]
    probe = subprocess.run([sys.executable, "-X", "importtime", "-m", "stagewise", *argv], env=env, cwd=ROOT,
                           capture_output=True, text=True)
    torch = any(line.split("|")[-1].strip() == "torch" for line in probe.stderr.splitlines())
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return statistics.median(times), torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = _make_models(Path(tmp))
        for name, argv, target in _cases(models):
            median_s, torch = _time(argv, args.runs)
            rows.append({"case": name, "argv": argv, "median_s": round(median_s, 3), "target_s": target,
                         "torch_imported": torch, "ok": median_s < target and not torch})
    print(f"{'case':36} {'median s':>9} {'target':>7} {'torch':>6}")
    for r in rows:
        print(f"{r['case']:36} {r['median_s']:>9.3f} {r['target_s']:>7.1f} {'yes' if r['torch_imported'] else 'no':>6}")
    result = {
        "command": "PYTHONPATH=. " + " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores {platform.platform()}",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "runs": args.runs,
        "rows": rows,
        "all_ok": all(r["ok"] for r in rows),
    }
    out = Path(__file__).parent / "results" / "plan_latency.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
