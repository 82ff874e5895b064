"""GGUFFile: one GGUF model — a single ``.gguf`` or the parts of a split one — memory-mapped.

Split models (``name-00001-of-00003.gguf`` …, as written by ``llama-gguf-split`` and
``gguf.GGUFWriter(split_max_size=…)``) read as one: metadata comes from the first part, tensors
from whichever part holds them. Tensor bytes are views of a private (copy-on-write) mapping of
the file, so reading a tensor copies nothing until it is placed on a device.
"""

from __future__ import annotations

import mmap
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stagewise.errors import CorruptModelFile, ModelNotFound
from stagewise.weights.gguf_header import GGUFHeader, GGUFTensorInfo, read_gguf_header

if TYPE_CHECKING:
    import torch

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_parts(path: Path) -> list[Path]:
    """All parts of the model ``path`` belongs to (just ``[path]`` when it is not split)."""
    match = _SPLIT.match(path.name)
    if not match:
        return [path]
    count = int(match["count"])
    if count < 1:
        raise CorruptModelFile(f"{path}: split name says 0 parts")
    parts = [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for part in parts:
        if not part.exists():
            raise ModelNotFound(f"{part}: part of split model {path.name} is missing")
    return parts


class GGUFFile:
    """Metadata and tensor table of a (possibly split) GGUF model; tensor bytes on demand."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelNotFound(f"{self.path}: no such file")
        self.parts = split_parts(self.path)
        self.headers: list[GGUFHeader] = [read_gguf_header(p) for p in self.parts]
        self.fields: dict[str, Any] = dict(self.headers[0].fields)
        self.tensors: dict[str, tuple[int, GGUFTensorInfo]] = {}
        for index, header in enumerate(self.headers):
            for info in header.tensors:
                if info.name in self.tensors:
                    other = self.parts[self.tensors[info.name][0]].name
                    raise CorruptModelFile(f"{header.path}: tensor {info.name!r} is also in {other}")
                self.tensors[info.name] = (index, info)
        self._check_split_fields()
        self._maps: dict[int, mmap.mmap] = {}

    def _check_split_fields(self) -> None:
        count = self.fields.get("split.count")
        if count is None and len(self.parts) == 1:
            return
        if count != len(self.parts):
            raise CorruptModelFile(f"{self.path}: split.count is {count!r} but {len(self.parts)} parts were found")
        for index, header in enumerate(self.headers):
            if header.fields.get("split.no") != index:
                raise CorruptModelFile(f"{header.path}: split.no is {header.fields.get('split.no')!r}, expected {index}")
        total = self.fields.get("split.tensors.count")
        if total is not None and total != len(self.tensors):
            raise CorruptModelFile(f"{self.path}: split.tensors.count is {total} but the parts hold {len(self.tensors)}")

    @property
    def label(self) -> str:
        return str(self.path)

    def info(self, name: str) -> GGUFTensorInfo:
        return self.tensors[name][1]

    def raw(self, name: str) -> torch.Tensor:
        """The tensor's bytes as a CPU ``uint8`` tensor viewing the file's mapping (no copy)."""
        import torch  # NOTE: only here: reading the header (plan, assess) stays torch-free

        index, info = self.tensors[name]
        buf = self._map(index)
        return torch.frombuffer(buf, dtype=torch.uint8, count=info.nbytes, offset=info.offset_bytes)

    def release(self, name: str) -> None:
        """Drop the mapped pages of ``name`` from this process (after its bytes went to a device),
        so host RSS while loading onto accelerators stays bounded by one tensor, not the file."""
        index, info = self.tensors[name]
        if index not in self._maps or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        start = info.offset_bytes // page * page
        end = -(-(info.offset_bytes + info.nbytes) // page) * page
        end = min(end, len(self._maps[index]))
        try:
            self._maps[index].madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, ValueError):
            pass  # an advisory only

    def _map(self, index: int) -> mmap.mmap:
        if index not in self._maps:
            part = self.parts[index]
            try:
                with part.open("rb") as fh:
                    # ACCESS_COPY: a private mapping, writable in memory only, so torch can wrap it
                    # without a read-only warning while the file itself is never modified.
                    self._maps[index] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError) as exc:
                raise CorruptModelFile(f"{part}: cannot map the file ({exc})") from None
            if len(self._maps[index]) != self.headers[index].file_bytes:
                raise CorruptModelFile(f"{part}: file changed size since its header was read")
        return self._maps[index]
