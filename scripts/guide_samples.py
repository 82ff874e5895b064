"""Regenerate the sample outputs of docs/guide.md from the current CLI, so they cannot drift.

    python scripts/guide_samples.py            # rewrite docs/guide.md's samples in place
    python scripts/guide_samples.py --check    # exit 1, naming them, when a sample is out of date

A sample is the text between ``<!-- sample: NAME -->`` and ``<!-- /sample -->`` in the guide; :data:`SAMPLES`
says how each is made: a command run through ``python -m stagewise`` (the block shows ``$ stagewise ARGS`` and
what it printed) or text built from the CLI's own parser (make-model's presets and types).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "guide.md"
REFERENCE = "/work/shared/reference"
_SAMPLE = re.compile(r"(<!-- sample: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /sample -->)", re.S)


def _stagewise(*argv: str, stream: str = "stdout", code: int = 0) -> str:
    """What ``stagewise ARGV`` prints on ``stream`` (and must exit with ``code``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, "-m", "stagewise", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != code:
        raise SystemExit(f"stagewise {' '.join(argv)} exited {done.returncode} (not {code}):\n{done.stderr[-2000:]}")
    return done.stdout if stream == "stdout" else done.stderr


def _shown(argv: list[str], output: str, fence: str = "") -> str:
    return f"```{fence}\n$ stagewise {' '.join(argv)}\n{output.rstrip()}\n```\n"


def _command(argv: list[str], stream: str = "stdout", code: int = 0) -> Callable[[], str]:
    return lambda: _shown(argv, _stagewise(*argv, stream=stream, code=code))


def _run_json() -> str:
    """``run --json`` of the demo model, its placement shortened to its outcome and fingerprint."""
    argv = ["run", "--prompt-tokens", "1,2,3", "--max-tokens", "4", "--json"]
    out = json.loads(_stagewise(*argv))
    placement = out["placement"]
    logprobs = ", ".join(f"{p:.3f}" for p in out["logprobs"])
    text = (f'{{"tokens": {json.dumps(out["tokens"])}, "logprobs": [{logprobs}],\n'
            f' "placement": {{"outcome": "{placement["outcome"]}", "stages": [...], '
            f'"fingerprint": "{placement["fingerprint"][:15]}…", ...}}, "text": {json.dumps(out.get("text"))}}}')
    return _shown(argv, text)


def _make_model_options() -> str:
    """make-model's presets and ``--dtype`` types, as its parser lists them."""
    from stagewise.cli.main import build_parser
    from stagewise.weights.preset_configs import preset_names

    parser = build_parser("make_model")
    command = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["make-model"]
    dtypes = next(a for a in command._actions if "--dtype" in a.option_strings)
    dense = [d for d in dtypes.choices if d in ("f32", "f16", "bf16")]
    packed = [d for d in dtypes.choices if d not in dense]
    return (f"`--config` is a preset ({', '.join(f'`{p}`' for p in preset_names())}) or an HF `config.json`.\n"
            f"`--format gguf|safetensors` (gguf). `--dtype` ({dtypes.default}): {', '.join(f'`{d}`' for d in dense)}, "
            f"or for GGUF one of llama.cpp's types or presets, {', '.join(f'`{d}`' for d in packed)}.\n")


SAMPLES: dict[str, Callable[[], str]] = {
    "assess-2x3090": _command(["assess", f"{REFERENCE}/models/qwen3.6-35b-a3b.json", "--format", "q8_0",
                               "--devices", f"{REFERENCE}/topologies/seed-2x3090-pcie.json"]),
    "run-json": _run_json,
    "make-model-options": _make_model_options,
    "error-devices": _command(["run", "--devices", "3x"], stream="stderr", code=2),
    "error-arguments": _command(["run", "--context", "abc"], stream="stderr", code=2),
}


def regenerate(text: str) -> tuple[str, list[str]]:
    """``text`` with every sample made afresh, and the names of those that changed."""
    changed: list[str] = []
    found: set[str] = set()

    def fresh(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in SAMPLES:
            raise SystemExit(f"{GUIDE}: unknown sample {name!r} (known: {', '.join(SAMPLES)})")
        found.add(name)
        body = SAMPLES[name]()
        if body != match["body"]:
            changed.append(name)
        return match.group(1) + body + match.group(4)

    out = _SAMPLE.sub(fresh, text)
    missing = set(SAMPLES) - found
    if missing:
        raise SystemExit(f"{GUIDE}: no place for the samples {', '.join(sorted(missing))}")
    return out, changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a sample is out of date")
    args = p.parse_args(argv)
    text = GUIDE.read_text()
    fresh, changed = regenerate(text)
    if args.check:
        if changed:
            print(f"{GUIDE}: out of date: {', '.join(changed)} (run python scripts/guide_samples.py)")
            return 1
        return 0
    GUIDE.write_text(fresh)
    print(f"{GUIDE}: {len(changed)} sample(s) rewritten{': ' + ', '.join(changed) if changed else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
