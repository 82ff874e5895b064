"""Write parameters as safetensors shards (each at most ``shard_max_bytes``) plus the index.

Headers are computed from the shapes first, then each tensor's bytes are streamed chunk by chunk,
so memory stays bounded by one chunk whatever the model's size.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from stagewise.errors import ConfigError

Chunks = Callable[[str, tuple[int, ...]], Iterator[torch.Tensor]]
DTYPES = {"f32": (torch.float32, "F32"), "f16": (torch.float16, "F16"), "bf16": (torch.bfloat16, "BF16")}
SHARD_MAX_BYTES = 2 * 1024**3


def write_safetensors(directory: Path, params: list[tuple[str, tuple[int, ...]]], chunks: Chunks, dtype: str,
                      shard_max_bytes: int = SHARD_MAX_BYTES) -> list[Path]:
    """Write ``params`` into ``directory`` as ``model.safetensors`` or ``model-0000N-of-0000M.safetensors``."""
    if dtype not in DTYPES:
        raise ConfigError(f"safetensors dtype {dtype!r} is not supported ({', '.join(DTYPES)})")
    torch_dtype, st_dtype = DTYPES[dtype]
    item = torch.empty((), dtype=torch_dtype).element_size()
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for name, shape in params:
        nbytes = math.prod(shape) * item
        if shards[-1] and used + nbytes > shard_max_bytes:
            shards.append([])
            used = 0
        shards[-1].append((name, shape))
        used += nbytes
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map: dict[str, str] = {}
    total = 0
    for file_name, shard in zip(names, shards, strict=True):
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in shard:
            nbytes = math.prod(shape) * item
            header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file_name
        total += offset
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with (directory / file_name).open("wb") as fh:
            fh.write(struct.pack("<Q", len(raw)))
            fh.write(raw)
            for name, shape in shard:
                for piece in chunks(name, shape):
                    fh.write(piece.to(torch_dtype).contiguous().view(torch.uint8).numpy().tobytes())
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return [directory / n for n in names]
