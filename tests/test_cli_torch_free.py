"""``stagewise plan`` / ``assess`` / ``devices --devices SPEC`` read metadata only: no torch (seconds per call).

Each case runs the real dispatcher in a fresh interpreter and checks ``sys.modules`` at the end,
for every kind of MODEL: a config.json (with a quantized ``--format``), an HF directory, a GGUF
(Q8_0 and Q4_0: each tensor charged by its own type), a split GGUF, ``random:PRESET[@TYPE]`` and
a catalog directory. The models are made here with torch (in this test process), then only read
by the child.
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


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from stagewise.weights.make_model import make_model

    root = tmp_path_factory.mktemp("gguf")
    out = {fmt: Path(make_model("tiny-qwen3-moe", root / f"moe-{fmt}.gguf", "gguf", fmt, seed=0)) for fmt in ("q8_0", "q4_0")}
    out["split"] = Path(make_model("tiny-llama", root / "split" / "llama.gguf", "gguf", "q8_0", seed=0,
                                   split_max_bytes=100_000))
    return out


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory, safetensors_dir: Path, gguf_files: dict[str, Path]) -> Path:
    root = tmp_path_factory.mktemp("catalog")
    (root / "tiny.json").write_text(PRESET.read_text())
    (root / "moe.gguf").symlink_to(gguf_files["q4_0"])
    (root / "hf").symlink_to(safetensors_dir, target_is_directory=True)
    return root


def _run(*argv: str) -> dict[str, object]:
    return _run_with_output(*argv)[0]


def _run_with_output(*argv: str) -> tuple[dict[str, object], str]:
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    result: dict[str, object] = json.loads(lines[-1])
    return result, "\n".join(lines[:-1])


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


@pytest.mark.parametrize("command", ["plan", "assess"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_k_m", "iq2_xs"])
def test_config_with_quantized_format_without_torch(command: str, fmt: str) -> None:
    result = _run(command, str(PRESET), "--format", fmt, "--devices", "cpu:2x1GiB", "--json")
    assert result == {"code": 0, "torch": []}


@pytest.mark.parametrize("command", ["plan", "assess"])
@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "split"])
def test_gguf_without_torch(command: str, kind: str, gguf_files: dict[str, Path]) -> None:
    path = gguf_files[kind]
    if kind == "split":
        path = sorted(path.parent.glob("*.gguf"))[0]
        assert "-00001-of-" in path.name
    result = _run(command, str(path), "--devices", "cpu:2x1GiB", "--json")
    assert result == {"code": 0, "torch": []}


@pytest.mark.parametrize("model", ["random:tiny-llama", "random:tiny-qwen3-moe@q4_k", "random:tiny-qwen3.5@q8_0"])
def test_random_preset_without_torch(model: str) -> None:
    result = _run("assess", model, "--devices", "cpu:2x1GiB", "--json")
    assert result == {"code": 0, "torch": []}


def test_catalog_without_torch(catalog: Path) -> None:
    result, out = _run_with_output("assess", str(catalog), "--devices", "cpu:2x1GiB", "--json")
    assert result == {"code": 0, "torch": []}
    rows = {r["model"]: r["outcome"] for r in json.loads(out)}
    assert rows == {"tiny.json": "fits_single", "moe.gguf": "fits_single", "hf": "fits_single"}


@pytest.mark.parametrize("spec", ["cpu:2x4GiB", "24GiB,12GiB"])
def test_devices_spec_without_torch(spec: str) -> None:
    result = _run("devices", "--devices", spec, "--json")
    assert result == {"code": 0, "torch": []}


@pytest.mark.parametrize("command", ["run", "bench", "serve", "chat"])
def test_command_help_without_torch(command: str) -> None:
    """``stagewise COMMAND --help`` prints its options without importing torch (it took 1.7 s for run and bench)."""
    code = ("import sys\nfrom stagewise.cli.main import main\ntry:\n    main([sys.argv[1], '--help'])\n"
            "except SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])")
    done = subprocess.run([sys.executable, "-c", code, command], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "usage: stagewise" in done.stdout and done.stdout.strip().splitlines()[-1] == "[]"
