"""Prefix block hashes: the key of a full KV block is the hash of every token up to its end (and of
the model), chained block by block as vLLM's prefix cache does, so equal keys mean equal prefixes.

Torch-free and deterministic across processes (BLAKE2b, not Python's salted ``hash``): the one
allocator of a pipeline computes them once and the block ids they name are the same on every stage,
so a hit is a hit on all stages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

DIGEST_BYTES = 16  # 128-bit keys: a collision is as likely as a random 128-bit match


def model_key(identity: str) -> bytes:
    """The root of a model's chain: the hash of ``identity`` (its config, e.g. ``repr(ModelConfig)``)."""
    return hashlib.blake2b(identity.encode(), digest_size=DIGEST_BYTES).digest()


def block_hashes(root: bytes, ids: Sequence[int], block_tokens: int) -> list[bytes]:
    """The key of each full block of ``ids`` (``len(ids) // block_tokens`` keys): block ``i``'s key
    hashes block ``i - 1``'s key (``root`` for the first) with its ``block_tokens`` token ids."""
    keys: list[bytes] = []
    parent = root
    for end in range(block_tokens, len(ids) + 1, block_tokens):
        chunk = ids[end - block_tokens : end]
        digest = hashlib.blake2b(parent, digest_size=DIGEST_BYTES)
        digest.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in chunk))  # token ids < 2**32
        parent = digest.digest()
        keys.append(parent)
    return keys
