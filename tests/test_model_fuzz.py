"""Fuzzed model files: each one loads equal to the original, or raises a one-line typed error, fast.

Mutations are seeded and aimed at what describes the data, not at the data itself: the GGUF
header's counts, lengths, value types, tensor dims, types and offsets, the geometry fields the
tensors pin down, bytes of the tensor table, truncations; the safetensors header length and the
JSON header's bytes. (A flipped weight byte, or a changed free value such as ``context_length`` or
a token's spelling, makes a different but well-formed model: no reader can tell, llama.cpp neither.)

"Loads" means the whole path a user takes: open the model, build it on meta, load every tensor on
CPU, build the tokenizer. Each outcome must come within :data:`LIMIT_S` and the process must not
grow by more than :data:`GROWTH_BYTES` over the whole fuzz.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import resource
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import pytest
import torch

from stagewise.engine.opened_model import open_model
from stagewise.errors import ConfigError, CorruptModelFile, StagewiseError, UnsupportedTensorType, WeightsError
from stagewise.models.registry import build_stage
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.make_model import make_model
from stagewise.weights.stage_loader import load_stage

CPU = torch.device("cpu")
LIMIT_S = 2.0
GROWTH_BYTES = 512 << 20
GEOMETRY_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                 "attention.head_count_kv", "attention.key_length", "attention.value_length", "vocab_size")
_WIDE = [0, 1, 2, 3, 1 << 31, (1 << 32) - 1, 1 << 40, 1 << 63, (1 << 64) - 1]


def _load(path: Path) -> tuple[Any, dict[str, torch.Tensor], dict[str, int] | None]:
    opened = open_model(str(path))
    stage = build_stage(opened.config, 0, opened.config.num_layers, True, True)
    load_stage(stage, opened.source, CPU, torch.float32)
    vocab = opened.tokenizer.backend.get_vocab() if opened.tokenizer is not None else None
    return opened.config, stage.state_dict(), vocab


def _outcome(path: Path, reference: tuple[Any, dict[str, torch.Tensor], dict[str, int] | None]) -> str:
    """``equal`` or the typed error's class name; fails on anything else, on a slow answer, on a changed model."""
    start = time.monotonic()
    try:
        config, weights, vocab = _load(path)
    except StagewiseError as exc:
        message = str(exc)
        assert "\n" not in message and message, message
        outcome = type(exc).__name__
    else:
        ref_config, ref_weights, ref_vocab = reference
        assert config == ref_config, f"{path.name}: accepted with a different config"
        assert weights.keys() == ref_weights.keys()
        for name, tensor in weights.items():
            assert torch.equal(tensor, ref_weights[name]), f"{path.name}: accepted with a different {name}"
        assert vocab == ref_vocab, f"{path.name}: accepted with a different vocabulary"
        outcome = "equal"
    elapsed = time.monotonic() - start
    assert elapsed < LIMIT_S, f"{path.name}: {outcome} after {elapsed:.1f} s"
    return outcome


# --- GGUF ----------------------------------------------------------------------------------------
def _gguf_fields(data: bytes) -> list[tuple[str, int, int, int]]:
    """Every structural integer of a GGUF header as (what, byte position, width, value), and the
    geometry metadata values (an independent walk of the format, not the reader under test)."""
    out: list[tuple[str, int, int, int]] = []
    pos = 8

    def take(what: str, width: int) -> int:
        nonlocal pos
        value = int.from_bytes(data[pos : pos + width], "little")
        out.append((what, pos, width, value))
        pos += width
        return value

    def skip_string(what: str) -> str:
        nonlocal pos
        n = take(what, 8)
        text = data[pos : pos + n].decode()
        pos += n
        return text

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    n_tensors, n_kv = take("tensor count", 8), take("kv count", 8)
    for _ in range(n_kv):
        key = skip_string("key length")
        vtype = take(f"{key} type", 4)
        if vtype == gguf.GGUFValueType.STRING:
            skip_string(f"{key} length")
        elif vtype == gguf.GGUFValueType.ARRAY:
            item, count = take(f"{key} item type", 4), take(f"{key} count", 8)
            for i in range(count):
                if item == gguf.GGUFValueType.STRING:
                    if i < 4:
                        skip_string(f"{key}[{i}] length")
                    else:
                        pos += 8 + int.from_bytes(data[pos : pos + 8], "little")
                else:
                    pos += sizes[item]
        elif key.split(".", 1)[-1] in GEOMETRY_KEYS:
            take(f"{key} value", sizes[vtype])
        else:
            pos += sizes[vtype]
    for _ in range(n_tensors):
        name = skip_string("tensor name length")
        n_dims = take(f"{name} dims", 4)
        for d in range(n_dims):
            take(f"{name} dim {d}", 8)
        take(f"{name} type", 4)
        take(f"{name} offset", 8)
    return out


def _mutate_gguf(data: bytes, fields: list[tuple[str, int, int, int]], table: tuple[int, int],
                 rng: random.Random) -> tuple[str, bytes]:
    buf = bytearray(data)
    kind = rng.random()
    if kind < 0.6:  # rewrite one structural integer
        what, pos, width, value = rng.choice(fields)
        new = rng.choice([*_WIDE, value + 1, value - 1, value * 2, value // 2, rng.randrange(1 << 16)])
        new %= 1 << (8 * width)
        buf[pos : pos + width] = new.to_bytes(width, "little")
        return f"{what}={new}", bytes(buf)
    if kind < 0.85:  # flip bytes of the tensor table (names, dims, types, offsets)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(*table)
            buf[at] ^= 1 << rng.randrange(8)
        return "table flip", bytes(buf)
    cut = rng.randrange(len(data))
    return f"truncated at {cut}", bytes(buf[:cut])


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny-qwen3", tmp_path_factory.mktemp("g") / "m.gguf", "gguf", "q8_0", seed=3)


def test_fuzzed_gguf(tmp_path: Path, gguf_model: Path) -> None:
    data = gguf_model.read_bytes()
    fields = _gguf_fields(data)
    table_start = next(pos for what, pos, _, _ in fields if what == "tensor name length")
    table_end = fields[-1][1] + 8
    reference = _load(gguf_model)
    rng = random.Random(2126)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    outcomes: dict[str, int] = {}
    for i in range(240):
        what, mutated = _mutate_gguf(data, fields, (table_start, table_end), rng)
        path = tmp_path / f"fuzz{i}.gguf"
        path.write_bytes(mutated)
        try:
            outcome = _outcome(path, reference)
        except AssertionError as exc:
            raise AssertionError(f"mutation {i} ({what}): {exc}") from None
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        path.unlink()
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert growth < GROWTH_BYTES, f"peak memory grew {growth >> 20} MiB"
    assert outcomes.get("CorruptModelFile", 0) > 100 and len(outcomes) >= 4, outcomes


def _rewrite(data: bytes, what: str, value: int) -> bytes:
    field = next(f for f in _gguf_fields(data) if f[0] == what)
    return data[: field[1]] + value.to_bytes(field[2], "little") + data[field[1] + field[2] :]


def _shift(data: bytes, what: str, delta: int) -> bytes:
    field = next(f for f in _gguf_fields(data) if f[0] == what)
    return _rewrite(data, what, field[3] + delta)


def _tensor_field(data: bytes, suffix: str, index: int = 0) -> str:
    return [f[0] for f in _gguf_fields(data) if f[0].endswith(".weight" + suffix)][index]


GGUFCase = Callable[[bytes], bytes]
GGUF_CASES: dict[str, tuple[GGUFCase, type[StagewiseError], str]] = {
    "block_count 2**31": (lambda d: _rewrite(d, "qwen3.block_count value", 1 << 31), StagewiseError,
                          r"block_count is 2147483648 .* tensors for 3 blocks"),
    "huge array length": (lambda d: _rewrite(d, "tokenizer.ggml.tokens count", 1 << 62), CorruptModelFile,
                          "truncated header while reading field tokenizer.ggml.tokens"),
    "huge string length": (lambda d: _rewrite(d, "general.name length", (1 << 64) - 1), CorruptModelFile,
                           "truncated header"),
    "huge tensor count": (lambda d: _rewrite(d, "tensor count", 1 << 40), CorruptModelFile, "more than the file holds"),
    "truncated file": (lambda d: d[: len(d) - 1000], CorruptModelFile, "beyond the file"),
    "truncated header": (lambda d: d[:3000], CorruptModelFile, "truncated header"),
    "offset beyond EOF": (lambda d: _rewrite(d, _tensor_field(d, " offset", -1), 1 << 40), CorruptModelFile,
                          "beyond the file"),
    "overlapping tensors": (lambda d: _rewrite(d, _tensor_field(d, " offset", 1), 0), CorruptModelFile,
                            "overlaps tensor"),
    "gap between tensors": (lambda d: _shift(d, _tensor_field(d, " offset", -1), 32) + bytes(32), CorruptModelFile,
                            "has offset .*, expected"),
    "unknown tensor type": (lambda d: _rewrite(d, _tensor_field(d, " type", 0), 99), UnsupportedTensorType,
                            "unknown type id 99"),
    "tensor type changed": (lambda d: _rewrite(d, _tensor_field(d, " type", -1), int(gguf.GGMLQuantizationType.F16)),
                            CorruptModelFile, "after the last tensor"),
    "zero dim": (lambda d: _rewrite(d, _tensor_field(d, " dim 0", 0), 0), CorruptModelFile, "absurd shape"),
    "dims product overflow": (lambda d: _rewrite(d, _tensor_field(d, " dim 0", 0), 1 << 62), CorruptModelFile,
                              "absurd shape"),
    "shape vs config": (lambda d: _rewrite(d, "qwen3.feed_forward_length value", 96), CorruptModelFile,
                        "metadata implies"),
    "value type changed": (lambda d: _rewrite(d, "qwen3.block_count type", int(gguf.GGUFValueType.FLOAT32)),
                           StagewiseError, "block_count must be an integer"),
    "unknown value type": (lambda d: _rewrite(d, "qwen3.block_count type", 77), CorruptModelFile,
                           "unknown value type 77"),
}


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_bad_gguf(tmp_path: Path, gguf_model: Path, case: str) -> None:
    mutate, error, message = GGUF_CASES[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(mutate(gguf_model.read_bytes()))
    start = time.monotonic()
    with pytest.raises(error, match=message) as info:
        _load(path)
    assert time.monotonic() - start < LIMIT_S
    assert "bad.gguf" in str(info.value) and "\n" not in str(info.value)


def test_value_type_of_equal_value_loads(tmp_path: Path, gguf_model: Path) -> None:
    """A u32 field rewritten as i32 holds the same number: the file still loads, unchanged."""
    path = tmp_path / "same.gguf"
    path.write_bytes(_rewrite(gguf_model.read_bytes(), "qwen3.block_count type", int(gguf.GGUFValueType.INT32)))
    assert _outcome(path, _load(gguf_model)) == "equal"


# --- safetensors -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def st_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny-qwen3", tmp_path_factory.mktemp("s") / "m", "safetensors", "f32", seed=3)


def _copy_dir(src: Path, dst: Path, weights: bytes) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    (dst / "model.safetensors").write_bytes(weights)
    return dst


def _st_parts(data: bytes) -> tuple[int, dict[str, Any]]:
    (n,) = struct.unpack_from("<Q", data)
    return n, json.loads(data[8 : 8 + n])


def _with_header(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    n, header = _st_parts(data)
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def _first_tensor(header: dict[str, Any]) -> dict[str, Any]:
    return header[sorted(k for k in header if k != "__metadata__")[0]]


def test_fuzzed_safetensors(tmp_path: Path, st_model: Path) -> None:
    data = (st_model / "model.safetensors").read_bytes()
    n, _ = _st_parts(data)
    reference = _load(st_model)
    rng = random.Random(2127)
    outcomes: dict[str, int] = {}
    for i in range(120):
        buf = bytearray(data)
        kind = rng.random()
        if kind < 0.6:  # JSON bytes: digits and punctuation move shapes, offsets, names, dtypes
            for _ in range(rng.randint(1, 2)):
                buf[8 + rng.randrange(n)] = ord(rng.choice('0123456789,:[]{}"FUBI_x '))
            what = "json"
        elif kind < 0.8:
            value = rng.choice([*_WIDE, n + 1, n - 1, n + 8, len(data)]) % (1 << 64)
            buf[:8] = struct.pack("<Q", value)
            what = f"header length {value}"
        else:
            cut = rng.randrange(len(data))
            buf = buf[:cut]
            what = f"truncated at {cut}"
        try:
            outcome = _outcome(_copy_dir(st_model, tmp_path / "fuzz", bytes(buf)), reference)
        except AssertionError as exc:
            raise AssertionError(f"mutation {i} ({what}): {exc}") from None
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("CorruptModelFile", 0) > 60, outcomes


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda header: _first_tensor(header).__setitem__(key, value)


def _rename(header: dict[str, Any]) -> None:
    name = sorted(k for k in header if k != "__metadata__")[0]
    header[name + "x"] = header.pop(name)


STCase = Callable[[bytes], bytes]
ST_CASES: dict[str, tuple[STCase, type[StagewiseError], str]] = {
    "header length beyond file": (lambda d: struct.pack("<Q", len(d)) + d[8:], CorruptModelFile, "not a valid"),
    "header length 2**64-1": (lambda d: struct.pack("<Q", (1 << 64) - 1) + d[8:], CorruptModelFile, "not a valid"),
    "bad JSON header": (lambda d: d[:8] + b"[" + d[9:], CorruptModelFile, "not a valid"),
    "unknown dtype": (lambda d: _with_header(d, _set("dtype", "F7")), CorruptModelFile, "not a valid"),
    "integer dtype": (lambda d: _with_header(d, _set("dtype", "I32")), UnsupportedTensorType, "dtype I32"),
    "shape and byte size disagree": (lambda d: _with_header(d, _set("shape", [3, 3])), CorruptModelFile, "not a valid"),
    "offset beyond data": (lambda d: _with_header(d, _set("data_offsets", [0, 1 << 40])), CorruptModelFile,
                           "not a valid"),
    "truncated data": (lambda d: d[:-100], CorruptModelFile, "not a valid"),
    "header not an object": (lambda d: struct.pack("<Q", 8) + b'"xxxxxx"', CorruptModelFile, "not a valid"),
    "renamed tensor": (lambda d: _with_header(d, _rename), WeightsError, "tensor"),
}


@pytest.mark.parametrize("case", sorted(ST_CASES))
def test_bad_safetensors(tmp_path: Path, st_model: Path, case: str) -> None:
    mutate, error, message = ST_CASES[case]
    bad = _copy_dir(st_model, tmp_path / "bad", mutate((st_model / "model.safetensors").read_bytes()))
    start = time.monotonic()
    with pytest.raises(error, match=message) as info:
        _load(bad)
    assert time.monotonic() - start < LIMIT_S
    assert "bad" in str(info.value) and "\n" not in str(info.value)


# --- config values: config.json fields and GGUF metadata values --------------------------------------
def _typed(config: ModelConfig) -> None:
    """A config that loaded has every field of its declared kind (no ``"yes"`` taken as True)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.type in ("int", int):
            assert isinstance(value, int) and not isinstance(value, bool), (f.name, value)
        elif f.type in ("bool", bool):
            assert isinstance(value, bool), (f.name, value)
        elif f.type in ("float", float):
            assert isinstance(value, float) and math.isfinite(value), (f.name, value)


def _value_outcome(path: Path) -> str:
    """``loaded`` (with a typed config) or the typed error's class name, one line, within :data:`LIMIT_S`."""
    start = time.monotonic()
    try:
        config, _, _ = _load(path)
    except StagewiseError as exc:
        assert "\n" not in str(exc) and str(exc), str(exc)
        assert not any(name in str(exc) for name in ("Traceback", "RecursionError", "JSONDecodeError")), str(exc)
        outcome = type(exc).__name__
    else:
        _typed(config)
        outcome = "loaded"
    elapsed = time.monotonic() - start
    assert elapsed < LIMIT_S, f"{path.name}: {outcome} after {elapsed:.1f} s"
    return outcome


def _hostile_value(rng: random.Random, old: Any) -> Any:
    deep: Any = []
    for _ in range(rng.choice([3, 100, 100_000])):
        deep = [deep]
    choices: list[Any] = [None, "x", "yes", "", True, False, -1, 0, 1, 2, 1_000_000_000, 1 << 63, -(1 << 63), 0.5, 1e308,
                          -1e-9, [], {}, [1, 2], {"a": 1}, "1" * 5000, deep]
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        choices += [old + 1, old - 1, old * 2, old // 2 if isinstance(old, int) else old / 2, -old]
    return rng.choice(choices)


CONFIG_KEYS_EXTRA = ("rope_scaling", "rope_parameters", "text_config", "head_dim", "num_key_value_heads",
                     "eos_token_id", "bos_token_id", "mlp_only_layers", "layer_types", "full_attention_interval",
                     "partial_rotary_factor", "num_experts", "decoder_sparse_step")


def test_fuzzed_config_json_values(tmp_path: Path, st_model: Path) -> None:
    """Seeded: one config.json field set to a hostile value (wrong type, huge, negative, deep) loads with a
    typed config or raises one typed one-line error, fast, in bounded memory."""
    config = json.loads((st_model / "config.json").read_text())
    keys = sorted(set(config) | set(CONFIG_KEYS_EXTRA))
    rng = random.Random(3101)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    outcomes: dict[str, int] = {}
    target = tmp_path / "cfg"
    shutil.copytree(st_model, target)
    for i in range(160):
        key = rng.choice(keys)
        value = _hostile_value(rng, config.get(key))
        mutated = {**config, key: value}
        (target / "config.json").write_text(json.dumps(mutated) if not _deep(value) else _deep_json(mutated, key))
        try:
            outcome = _value_outcome(target)
        except (AssertionError, RecursionError, MemoryError) as exc:
            raise AssertionError(f"mutation {i} ({key}={str(value)[:40]}): {type(exc).__name__}: {exc}") from None
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert growth < GROWTH_BYTES, f"peak memory grew {growth >> 20} MiB"
    assert outcomes.get("ConfigError", 0) > 40 and outcomes.get("loaded", 0) > 5, outcomes


def _deep(value: Any) -> bool:
    depth = 0
    while isinstance(value, list) and value:
        value, depth = value[0], depth + 1
    return depth > 500


def _deep_json(config: dict[str, Any], key: str) -> str:
    """``config`` with ``key`` a 100k-deep array (json.dumps would recurse that deep)."""
    rest = json.dumps({k: v for k, v in config.items() if k != key})
    return rest[:-1] + f', "{key}": ' + "[" * 100_001 + "]" * 100_001 + "}"


@pytest.mark.parametrize(("key", "value", "message"), [
    ("num_hidden_layers", 1_000_000_000, "'num_hidden_layers' must be an integer in"),
    ("rms_norm_eps", "x", "'rms_norm_eps' must be a finite number"),
    ("tie_word_embeddings", "yes", "'tie_word_embeddings' must be true or false"),
    ("hidden_size", 1.5, "'hidden_size' must be an integer"),
    ("eos_token_id", [1, 1 << 40], "'eos_token_id' must be a list"),
])
def test_bad_config_value(tmp_path: Path, st_model: Path, key: str, value: Any, message: str) -> None:
    target = tmp_path / "bad"
    shutil.copytree(st_model, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, key: value}))
    start = time.monotonic()
    with pytest.raises(ConfigError, match=message) as info:
        _load(target)
    assert time.monotonic() - start < LIMIT_S
    assert "config.json" in str(info.value) and "\n" not in str(info.value)


def test_deep_config_value_is_one_line(tmp_path: Path, st_model: Path) -> None:
    target = tmp_path / "deep"
    shutil.copytree(st_model, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(_deep_json(config, "rope_scaling"))
    with pytest.raises(ConfigError, match="nested too deep"):
        _load(target)


def _gguf_scalar_values(data: bytes) -> list[tuple[str, int, int, int]]:
    """Every scalar metadata value of a GGUF header as (key, byte position, width, value type)."""
    out: list[tuple[str, int, int, int]] = []
    pos = 8
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def u64() -> int:
        nonlocal pos
        pos += 8
        return int.from_bytes(data[pos - 8 : pos], "little")

    _, n_kv = u64(), u64()
    for _ in range(n_kv):
        n = u64()
        key = data[pos : pos + n].decode()
        pos += n
        vtype = int.from_bytes(data[pos : pos + 4], "little")
        pos += 4
        if vtype == gguf.GGUFValueType.STRING:
            length = u64()  # NOTE: not `pos += u64()`: that reads pos before u64 moves it
            pos += length
        elif vtype == gguf.GGUFValueType.ARRAY:
            item = int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
            for _ in range(u64()):
                step = u64() if item == gguf.GGUFValueType.STRING else sizes[item]
                pos += step
        else:
            out.append((key, pos, sizes[vtype], vtype))
            pos += sizes[vtype]
    return out


def test_fuzzed_gguf_metadata_values(tmp_path: Path, gguf_model: Path) -> None:
    """Seeded: one scalar GGUF metadata value (any key: geometry, eps, rope base, token ids) rewritten to a
    wide integer or random bits (NaN, inf, negative floats): loads typed or one typed one-line error, fast."""
    data = gguf_model.read_bytes()
    values = _gguf_scalar_values(data)
    rng = random.Random(3102)
    outcomes: dict[str, int] = {}
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for i in range(160):
        key, pos, width, vtype = rng.choice(values)
        if vtype == gguf.GGUFValueType.FLOAT32:
            raw = rng.choice([struct.pack("<f", v) for v in (math.nan, math.inf, -1.0, 0.0, 1e38, 1e-45)]
                             + [rng.randbytes(4)])
        else:
            raw = (rng.choice([*_WIDE, rng.randrange(1 << 16)]) % (1 << (8 * width))).to_bytes(width, "little")
        path = tmp_path / f"value{i}.gguf"
        path.write_bytes(data[:pos] + raw + data[pos + width :])
        try:
            outcome = _value_outcome(path)
        except AssertionError as exc:
            raise AssertionError(f"mutation {i} ({key}={raw.hex()}): {exc}") from None
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        path.unlink()
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert growth < GROWTH_BYTES, f"peak memory grew {growth >> 20} MiB"
    assert outcomes.get("loaded", 0) > 5 and sum(outcomes.values()) - outcomes.get("loaded", 0) > 40, outcomes


@pytest.mark.parametrize(("old", "new"), [(b"rope_freqs.weight", b"rope_freqs.weighu"),
                                          (b"blk.1.ffn_up.weight", b"blk.1.ffn_uq.weight")])
def test_unknown_gguf_tensor_is_named(tmp_path: Path, old: bytes, new: bytes) -> None:
    """One flipped bit in a tensor name: an error naming it, not a model that runs without that tensor
    (``rope_freqs.weight`` is optional: without it the Llama 3 rope scaling silently went away)."""
    data = make_model("tiny-llama", tmp_path / "m.gguf", "gguf", "q8_0", seed=3).read_bytes()
    assert data.count(old) == 1
    path = tmp_path / "flipped.gguf"
    path.write_bytes(data.replace(old, new))
    with pytest.raises(WeightsError, match=f"unknown GGUF tensor '{new.decode()}'") as info:
        _load(path)
    assert "\n" not in str(info.value)
