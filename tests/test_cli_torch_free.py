"""``stagewise plan`` / ``assess`` read metadata only: they must not import torch (seconds per call).

Each case runs the real dispatcher in a fresh interpreter and checks ``sys.modules`` at the end.
The models are made here with torch (in this test process), then only read by the child.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import stagewise

PRESET = Path(stagewise.__file__).parent / "assets" / "presets" / "tiny-llama.json"
ROOT = Path(stagewise.__file__).parent.parent

CHILD = """
import json, sys
from stagewise.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))[:3]}))
"""


@pytest.fixture(scope="module")
def safetensors_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stagewise.weights.make_model import make_model

    out = tmp_path_factory.mktemp("model") / "tiny"
    return Path(make_model("tiny-llama", out, fmt="safetensors", dtype="bf16", seed=0))


def _run(*argv: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("command", ["plan", "assess"])
def test_preset_config_without_torch(command: str) -> None:
    result = _run(command, str(PRESET), "--devices", "cpu:2x1GiB", "--json")
    assert result == {"code": 0, "torch": []}


@pytest.mark.parametrize("command", ["plan", "assess"])
def test_safetensors_dir_without_torch(command: str, safetensors_dir: Path) -> None:
    result = _run(command, str(safetensors_dir), "--devices", "cpu:2x1GiB", "--json")
    assert result == {"code": 0, "torch": []}


def test_bad_input_still_one_line_without_torch(tmp_path: Path) -> None:
    result = _run("plan", str(tmp_path / "missing.json"), "--devices", "cpu:2x1GiB")
    assert result == {"code": 2, "torch": []}
