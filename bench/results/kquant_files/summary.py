"""Table of run.sh's results: llama.cpp beside stagewise per file and stream count, with ratios.

Usage: python3 summary.py RESULTS_DIR  (prints Markdown). Decode tok/s: llama-batched-bench's S_TG and
`stagewise bench --concurrency`'s decode_tokens_per_s at the same counts; one stream also as llama-bench's tg128 beside
stagewise's single run (prompt 512); prefill as llama-bench's pp512 beside stagewise's prefill_tokens_per_s.
"""

import json
import sys
from pathlib import Path


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _batched(path: Path) -> dict[int, float]:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            rows[int(r["pl"])] = float(r["speed_tg"])
    return rows


def _llama_bench(path: Path) -> dict[str, float]:
    out = {}
    for r in _load(path) or []:
        if r.get("n_prompt") and not r.get("n_gen"):
            out["pp"] = r["avg_ts"]
        elif r.get("n_gen") and not r.get("n_prompt"):
            out["tg"] = r["avg_ts"]
    return out


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _fmt(x) -> str:
    return f"{x:,.0f}" if x else "-"


def main(results: Path) -> None:
    names = sorted({p.stem.split("_", 2)[-1] for p in results.glob("llamacpp_batched_*.jsonl")}
                   | {p.stem.split("_", 2)[-1] for p in results.glob("stagewise_concurrency_*.json")})
    print("| file | streams | llama.cpp S_TG | stagewise decode | ratio |")
    print("|---|---|---|---|---|")
    for name in names:
        theirs = _batched(results / f"llamacpp_batched_{name}.jsonl")
        conc = _load(results / f"stagewise_concurrency_{name}.json") or {}
        ours = {lv["streams"]: lv["decode_tokens_per_s"] for lv in conc.get("levels", [])}
        for n in sorted(set(theirs) | set(ours)):
            print(f"| {name} | {n} | {_fmt(theirs.get(n))} | {_fmt(ours.get(n))} | {_ratio(ours.get(n), theirs.get(n))} |")
    print()
    print("| file | llama.cpp tg128 | stagewise decode (1 stream, prompt 512) | ratio | roofline share |"
          " llama.cpp pp512 | stagewise prefill 512 | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        lb = _llama_bench(results / f"llamabench_{name}.json")
        single = (_load(results / f"stagewise_single_{name}.json") or {}).get("stagewise", {})
        dec, pre = single.get("decode_tokens_per_s"), single.get("prefill_tokens_per_s")
        roof = single.get("roofline_fraction")
        roof_s = f"{roof:.0%} of {single['roofline_decode_tokens_per_s']:,.0f}" if roof else "-"
        print(f"| {name} | {_fmt(lb.get('tg'))} | {_fmt(dec)} | {_ratio(dec, lb.get('tg'))} | {roof_s} |"
              f" {_fmt(lb.get('pp'))} | {_fmt(pre)} | {_ratio(pre, lb.get('pp'))} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
