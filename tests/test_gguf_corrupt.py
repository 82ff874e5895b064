"""Bad GGUF input gives a typed one-line error naming the file (and tensor), never a hang or a traceback."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path
from typing import Any

import gguf
import pytest
import torch

from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import ConfigError, CorruptModelFile, StagewiseError, UnsupportedTensorType
from stagewise.weights.gguf_header import read_gguf_header
from stagewise.weights.gguf_source import GGUFSource
from stagewise.weights.make_model import make_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny-qwen3", tmp_path_factory.mktemp("m") / "m.gguf", "gguf", "q8_0", seed=1)


def _gguf(tensors: list[tuple[str, list[int], int, int]], data_bytes: int, version: int = 3,
          fields: bytes = b"", n_fields: int = 0, n_tensors: int | None = None) -> bytes:
    """A hand-made GGUF: tensors as (name, dims in GGUF order, type id, offset)."""
    out = struct.pack("<IIQQ", gguf.GGUF_MAGIC, version, len(tensors) if n_tensors is None else n_tensors, n_fields)
    out += fields
    for name, dims, ggml_type, offset in tensors:
        raw = name.encode()
        out += struct.pack("<Q", len(raw)) + raw + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % 32)
    return out + b"\0" * data_bytes


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    return path


F32 = int(gguf.GGMLQuantizationType.F32)


@pytest.mark.parametrize(("data", "message"), [
    (b"", "too short"),
    (b"GGML" + b"\0" * 30, "not a GGUF file"),
    (_gguf([], 0, version=1), "version 1"),
    (_gguf([], 0, version=99), "version 99"),
    (_gguf([], 0, n_tensors=1 << 60), "more than the file holds"),
    (_gguf([("a", [4], F32, 0), ("b", [4], F32, 0)], 32), "'b' overlaps tensor 'a'"),
    (_gguf([("a", [8], F32, 0), ("b", [4], F32, 32)], 32), r"'b' data .* beyond the file"),
    (_gguf([("a", [8], F32, 1 << 62)], 32), r"'a' data .* beyond the file"),
    (_gguf([("a", [8], F32, 4)], 64), "'a' offset 4 is not aligned"),
    (_gguf([("a", [1 << 62, 4], F32, 0)], 32), "'a' has an absurd shape"),
    (_gguf([("a", [0], F32, 0)], 32), "'a' has an absurd shape"),
    (_gguf([("a", [8, 1, 1, 1, 1], F32, 0)], 32), "'a' has 5 dimensions"),
    (_gguf([("a", [31], int(gguf.GGMLQuantizationType.Q8_0), 0)], 64), "not a multiple of Q8_0's block"),
    (_gguf([], 0, fields=struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 4, 1 << 61), n_fields=1),
     "truncated header while reading field k"),
    (_gguf([], 0, fields=struct.pack("<Q", 1) + b"k" + struct.pack("<I", 77), n_fields=1), "unknown value type 77"),
    (_gguf([], 0, fields=struct.pack("<Q", 1 << 40) + b"k", n_fields=1), "truncated header"),
])
def test_malformed_headers(tmp_path: Path, data: bytes, message: str) -> None:
    with pytest.raises(CorruptModelFile, match=message) as info:
        read_gguf_header(_write(tmp_path, data))
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)


def test_unknown_tensor_type(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedTensorType, match="'a' has unknown type id 200"):
        read_gguf_header(_write(tmp_path, _gguf([("a", [8], 200, 0)], 64)))


def test_truncated_model_file(tmp_path: Path, model: Path) -> None:
    data = model.read_bytes()
    for cut in (100, len(data) // 3, len(data) - 1):
        with pytest.raises(CorruptModelFile) as info:
            GGUFSource(_write(tmp_path, data[:cut]))
        assert "bad.gguf" in str(info.value)


def _copy_with(src: Path, dst: Path, drop: tuple[str, ...] = (), override: dict[str, Any] | None = None) -> Path:
    reader = gguf.GGUFReader(src)
    arch = (override or {}).get("general.architecture", reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture" or field.name in drop:
            continue
        vtype = field.types[0]
        value = (override or {}).get(field.name, field.contents())
        writer.add_key_value(field.name, value, vtype, sub_type=field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_shapes_inconsistent_with_metadata(tmp_path: Path, model: Path) -> None:
    bad = _copy_with(model, tmp_path / "b.gguf", override={"qwen3.feed_forward_length": 96})
    with pytest.raises(CorruptModelFile, match=r"b\.gguf: tensor 'blk\.0\.ffn_down\.weight' has shape .* implies"):
        GGUFSource(bad)


@pytest.mark.parametrize("key", ["qwen3.block_count", "qwen3.embedding_length", "general.architecture"])
def test_missing_metadata(tmp_path: Path, model: Path, key: str) -> None:
    bad = _copy_with(model, tmp_path / "b.gguf", drop=(key,)) if key != "general.architecture" else None
    if bad is None:  # the writer always writes the architecture: corrupt its value instead
        bad = _copy_with(model, tmp_path / "b.gguf", override={"general.architecture": "mamba"})
    with pytest.raises(StagewiseError, match=r"b\.gguf"):
        GGUFSource(bad)


def test_missing_tokenizer_fields(tmp_path: Path, model: Path) -> None:
    bad = _copy_with(model, tmp_path / "b.gguf", drop=("tokenizer.ggml.tokens",))
    source = GGUFSource(bad)  # the weights are fine ...
    with pytest.raises(CorruptModelFile, match=r"tokenizer\.ggml\.tokens"):
        Tokenizer.from_gguf_fields(source.fields)  # ... the tokenizer is not


def test_missing_block_is_a_typed_error(tmp_path: Path, model: Path) -> None:
    bad = _copy_with(model, tmp_path / "b.gguf", override={"qwen3.block_count": 4})
    with pytest.raises((ConfigError, StagewiseError)):
        from stagewise.models.registry import build_stage
        from stagewise.weights.stage_loader import load_stage

        source = GGUFSource(bad)
        load_stage(build_stage(source.config, 0, 4, True, True), source, CPU, torch.float32)


def test_fuzzed_headers_raise_only_typed_errors(tmp_path: Path, model: Path) -> None:
    data = model.read_bytes()
    header = read_gguf_header(model)
    info_start = header.data_offset_bytes - 80 * len(header.tensors)  # roughly where the tensor table is
    rng = random.Random(1234)
    deadline = time.monotonic() + 40
    outcomes: dict[str, int] = {}
    for i in range(300):
        buf = bytearray(data)
        region = i % 3
        lo, hi = [(0, 700), (max(info_start, 0), header.data_offset_bytes), (0, header.data_offset_bytes)][region]
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(lo, hi)
            kind = rng.random()
            if kind < 0.5:
                buf[at] = rng.randrange(256)
            elif kind < 0.8:
                buf[at : at + 8] = struct.pack("<Q", rng.choice([0, 1, 1 << 32, 1 << 62, (1 << 64) - 1, rng.randrange(1 << 20)]))
            else:
                del buf[at:]
                break
        path = tmp_path / "fuzz.gguf"
        path.write_bytes(bytes(buf))
        try:
            source = GGUFSource(path)
            for name in sorted(source.names()):
                source.load(name, CPU, torch.float32)
            outcome = "ok"
        except StagewiseError as exc:  # anything else fails the test with its traceback
            assert "\n" not in str(exc)
            outcome = type(exc).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        assert time.monotonic() < deadline, f"fuzzing too slow after {i} files"
    assert outcomes.get("CorruptModelFile", 0) > 50, outcomes
