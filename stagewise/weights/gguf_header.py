"""GGUFHeader: the validated header (metadata + tensor table) of one ``.gguf`` file.

We parse the header ourselves, with the ``gguf`` package's constants, instead of trusting
``gguf.GGUFReader`` with a file we have not checked: on a corrupt array count the reader can
loop for 2**64 iterations (reads past the end return empty arrays and do not advance) or build
huge arrays. Here every count and length is checked against the bytes left in the file before it
is used, so a corrupt file costs at most one pass over its header and raises a typed error.
"""

from __future__ import annotations

import itertools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from stagewise.errors import CorruptModelFile, ModelNotFound, UnsupportedTensorType

SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 44  # no real tensor comes close; larger means a corrupt header
_MAX_NESTING = 2

_SCALARS: dict[int, tuple[str, int]] = {  # value type -> (struct format, size)
    GGUFValueType.UINT8: ("<B", 1), GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2), GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4), GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4), GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8), GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
_NUMPY: dict[int, str] = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8", GGUFValueType.BOOL: "<u1",
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of a GGUF file. ``shape`` is in torch order (GGUF stores it reversed)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    offset_bytes: int  # absolute, from the start of the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """Metadata (key -> plain Python value) and the tensor table of one GGUF file."""

    path: Path
    version: int
    fields: dict[str, Any]
    tensors: tuple[GGUFTensorInfo, ...]
    alignment: int
    data_offset_bytes: int
    file_bytes: int


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.end, self.path = buf, 0, len(buf), path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise CorruptModelFile(f"{self.path}: truncated header while reading {what} at byte {self.pos}")

    def scalar(self, vtype: int, what: str) -> Any:
        fmt, size = _SCALARS[vtype]
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT32, what))

    def u64(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT64, what))

    def string(self, what: str) -> str:
        n = self.u64(f"{what} length")
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptModelFile(f"{self.path}: {what} is not valid UTF-8") from None

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype, f"field {key}")
        if vtype == GGUFValueType.STRING:
            return self.string(f"field {key}")
        if vtype == GGUFValueType.ARRAY and depth < _MAX_NESTING:
            item = self.u32(f"field {key} item type")
            count = self.u64(f"field {key} length")
            if item in _NUMPY:
                size = _SCALARS[item][1]
                self.need(count * size, f"field {key}")
                arr = np.frombuffer(self.buf, dtype=_NUMPY[item], count=count, offset=self.pos)
                self.pos += count * size
                return [bool(v) for v in arr] if item == GGUFValueType.BOOL else arr.tolist()
            minimum = 8 if item == GGUFValueType.STRING else 12  # a string's length / an array's type + length
            self.need(count * minimum, f"field {key}")  # bounds the loop below
            return [self.value(item, key, depth + 1) for _ in range(count)]
        raise CorruptModelFile(f"{self.path}: field {key} has unknown value type {vtype}")


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Parse and validate ``path``'s header; tensor data is not read.

    Raises:
        ModelNotFound: the file does not exist.
        CorruptModelFile: bad magic or version, truncated header, bad counts, tensor data out of
            bounds or overlapping, shapes inconsistent with the tensor type.
        UnsupportedTensorType: a tensor type id unknown to ggml.
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            size = p.stat().st_size
            if size < 24:
                raise CorruptModelFile(f"{p}: {size} bytes is too short for a GGUF header")
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise ModelNotFound(f"{p}: no such file") from None
    except (OSError, ValueError) as exc:
        raise CorruptModelFile(f"{p}: cannot map the file ({exc})") from None
    try:
        return _parse(_Cursor(buf, p), size)
    finally:
        buf.close()


def _parse(cur: _Cursor, size: int) -> GGUFHeader:
    p = cur.path
    magic = cur.u32("magic")
    if magic != GGUF_MAGIC:
        raise CorruptModelFile(f"{p}: not a GGUF file (magic {magic:#010x})")
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise CorruptModelFile(f"{p}: GGUF version {version} is not supported (2, 3; big-endian files are not)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    if n_kv * 13 > size or n_tensors * 24 > size:  # smallest key/value and tensor-info records
        raise CorruptModelFile(f"{p}: header claims {n_kv} fields and {n_tensors} tensors, more than the file holds")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("field name")
        vtype = cur.u32(f"field {key} type")
        if key in fields:
            raise CorruptModelFile(f"{p}: duplicate field {key}")
        fields[key] = cur.value(vtype, key)
    alignment = fields.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise CorruptModelFile(f"{p}: general.alignment {alignment!r} is not a power of two")
    raw_infos = [_tensor_info(cur) for _ in range(n_tensors)]
    data_offset = -(-cur.pos // alignment) * alignment
    tensors = tuple(_validated(p, alignment, data_offset, size, *raw) for raw in raw_infos)
    _check_layout(p, tensors, data_offset, alignment, size)
    return GGUFHeader(p, version, fields, tensors, alignment, data_offset, size)


def _tensor_info(cur: _Cursor) -> tuple[str, list[int], int, int]:
    name = cur.string("tensor name")
    n_dims = cur.u32(f"tensor {name!r} dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise CorruptModelFile(f"{cur.path}: tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS})")
    dims = [cur.u64(f"tensor {name!r} shape") for _ in range(n_dims)]
    raw_type = cur.u32(f"tensor {name!r} type")
    offset = cur.u64(f"tensor {name!r} offset")
    return name, dims, raw_type, offset


def _validated(p: Path, alignment: int, data_offset: int, size: int,
               name: str, dims: list[int], raw_type: int, offset: int) -> GGUFTensorInfo:
    numel = 1
    for d in dims:
        if d <= 0 or d > MAX_ELEMENTS:
            raise CorruptModelFile(f"{p}: tensor {name!r} has an absurd shape {dims[::-1]}")
        numel *= d
    if numel > MAX_ELEMENTS:
        raise CorruptModelFile(f"{p}: tensor {name!r} has an absurd shape {dims[::-1]}")
    try:
        ggml_type = GGMLQuantizationType(raw_type)
    except ValueError:
        raise UnsupportedTensorType(f"{p}: tensor {name!r} has unknown type id {raw_type}") from None
    block, type_bytes = GGML_QUANT_SIZES[ggml_type]
    if dims[0] % block:
        raise CorruptModelFile(
            f"{p}: tensor {name!r} row length {dims[0]} is not a multiple of {ggml_type.name}'s block of {block}"
        )
    nbytes = numel // block * type_bytes
    if offset % alignment:
        raise CorruptModelFile(f"{p}: tensor {name!r} offset {offset} is not aligned to {alignment}")
    start = data_offset + offset
    if start + nbytes > size:
        raise CorruptModelFile(f"{p}: tensor {name!r} data [{start}, {start + nbytes}) is beyond the file's {size} bytes")
    return GGUFTensorInfo(name, tuple(reversed(dims)), ggml_type, start, nbytes)


def _check_layout(p: Path, tensors: tuple[GGUFTensorInfo, ...], data_offset: int, alignment: int, size: int) -> None:
    """Tensor data as llama.cpp's ``gguf_init`` requires it: each tensor starts where the previous one
    (in table order) ends, padded to the alignment; and the file ends within one alignment of the
    last tensor (every GGUF writer pads there), so no table entry can silently shrink or move."""
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise CorruptModelFile(f"{p}: duplicate tensor {t.name!r}")
        seen.add(t.name)
    ordered = sorted(tensors, key=lambda t: t.offset_bytes)
    for prev, cur in itertools.pairwise(ordered):
        if cur.offset_bytes < prev.offset_bytes + prev.nbytes:
            raise CorruptModelFile(f"{p}: tensor {cur.name!r} overlaps tensor {prev.name!r}")
    expected = data_offset
    for t in tensors:
        if t.offset_bytes != expected:
            raise CorruptModelFile(
                f"{p}: tensor {t.name!r} has offset {t.offset_bytes - data_offset}, expected {expected - data_offset} "
                "(tensor data must follow the table's order without gaps)"
            )
        expected += -(-t.nbytes // alignment) * alignment
    if tensors and size - expected >= alignment:
        raise CorruptModelFile(f"{p}: {size - expected} bytes after the last tensor's data; the tensor table does not "
                               "describe the data section")
