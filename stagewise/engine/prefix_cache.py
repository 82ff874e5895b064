"""PrefixCache: the pipeline's KV block allocator — blocks handed to sequences a block at a time, and
with prefix caching full prompt blocks that stay behind, keyed by their prefix hash
(:mod:`~stagewise.engine.block_hashes`), for later sequences with the same prefix to share read-only.

One allocator for the whole pipeline: every stage's pool has the same blocks and every stage's
block table the same rows, so an id names the same block everywhere (a staged pipeline and a
single device compute on the same layout). The batcher owns it; a sequence's blocks come back when
it ends or is preempted. With the prefix cache off nothing is ever keyed (:meth:`register` is not
called), so it is a plain free list: first freed first reused, as vLLM's free queue.

Every block is in exactly one of three states:

- free: no owner, no key (handed out first, first freed first reused);
- in use: held by ``refs[block] >= 1`` sequences (a shared prefix block by each sequence reading it);
- cached: no owner but a key, waiting in least-recently-used order to be hit again or evicted.

``allocate`` takes free blocks and only when none is left evicts the least recently used cached one
(its key is dropped); a block in use is never evicted. A sequence only ever writes positions past
its shared blocks (the hit is capped below the prompt's last token and covers only full blocks), so a
shared block is never written after it is keyed. Host integers only (no torch).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from stagewise.spec.kv_pool import KVPool, blocks_for


class OutOfBlocks(RuntimeError):
    """Asked for more blocks than are free (the batcher checks first; this is a bug if it escapes)."""


@dataclass(frozen=True)
class PrefixHit:
    """A lookup: the cached blocks of the longest cached prefix (in position order) and how many of
    them are cached-but-unowned now (acquiring those takes them out of the evictable ones)."""

    blocks: tuple[int, ...]
    idle: int

    def tokens(self, block_tokens: int) -> int:
        return len(self.blocks) * block_tokens


class PrefixCache:
    """Reference-counted KV blocks with an LRU cache of keyed, unowned blocks (module doc)."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self._free: deque[int] = deque(range(pool.blocks))
        self._refs: dict[int, int] = {}  # block -> sequences holding it (>= 1)
        self._by_key: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # keyed blocks no sequence holds, oldest first
        self.evictions = 0

    # ----- the allocator --------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        """Blocks ``allocate`` can hand out now: free plus cached-and-unowned (evictable)."""
        return len(self._free) + len(self._idle)

    @property
    def used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return len(self._refs)

    @property
    def cached_blocks(self) -> int:
        """Blocks with a prefix key (in use or not)."""
        return len(self._key_of)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` positions."""
        return blocks_for(tokens, self.pool.block_tokens)

    def allocate(self, count: int) -> list[int]:
        """``count`` blocks for one sequence to write: free ones first, then the least recently used
        cached ones, evicted (raises :class:`OutOfBlocks` when fewer than ``count`` are either)."""
        if count > self.free_blocks:
            raise OutOfBlocks(f"{count} KV blocks asked, {self.free_blocks} of {self.pool.blocks} free or evictable")
        ids = []
        for _ in range(count):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._idle.popitem(last=False)  # least recently used
                del self._by_key[self._key_of.pop(block)]
                self.evictions += 1
            self._refs[block] = 1
            ids.append(block)
        return ids

    def release(self, ids: list[int]) -> None:
        """One sequence lets go of ``ids`` (each must be held: a double free is a bug); a keyed block
        no one holds any more becomes the most recently used cached one, an unkeyed one free."""
        for block in ids:
            refs = self._refs.get(block, 0)
            if refs < 1:
                raise ValueError(f"KV block {block} released but not in use")
            if refs > 1:
                self._refs[block] = refs - 1
                continue
            del self._refs[block]
            if block in self._key_of:
                self._idle[block] = None
            else:
                self._free.append(block)

    # ----- prefixes -------------------------------------------------------------------------------
    def lookup(self, keys: list[bytes]) -> PrefixHit:
        """The cached blocks of the longest prefix of ``keys`` (nothing changes)."""
        blocks = []
        for key in keys:
            block = self._by_key.get(key)
            if block is None:
                break
            blocks.append(block)
        return PrefixHit(tuple(blocks), sum(b in self._idle for b in blocks))

    def acquire(self, hit: PrefixHit) -> list[int]:
        """Hold ``hit``'s blocks for one more sequence (they are no longer evictable); its blocks."""
        for block in hit.blocks:
            if block not in self._key_of:
                raise ValueError(f"KV block {block} is no longer cached")  # looked up, then evicted: a bug
            if block in self._idle:
                del self._idle[block]
                self._refs[block] = 1
            else:
                self._refs[block] += 1
        return list(hit.blocks)

    def register(self, blocks: list[int], keys: list[bytes]) -> int:
        """Key each of ``blocks`` (held, fully written, published) with ``keys`` (zip order) unless the
        block or the key is keyed already (a prefix two sequences computed at once keeps the first);
        returns the blocks newly keyed."""
        added = 0
        for block, key in zip(blocks, keys, strict=False):
            if block not in self._refs:
                raise ValueError(f"KV block {block} keyed but not in use")
            if block in self._key_of or key in self._by_key:
                continue
            self._by_key[key] = block
            self._key_of[block] = key
            added += 1
        return added

    def check(self) -> None:
        """Raise AssertionError unless the three states partition the pool (tests call it often)."""
        free, idle, used = set(self._free), set(self._idle), set(self._refs)
        assert not (free & idle) and not (free & used) and not (idle & used), "a block in two states"
        assert len(free) + len(idle) + len(used) == self.pool.blocks == len(self._free) + len(self._idle) + len(self._refs)
        assert idle <= set(self._key_of) and not (free & set(self._key_of)), "an idle block without key, or a free one with"
        assert all(self._by_key[k] == b for b, k in self._key_of.items()) and len(self._by_key) == len(self._key_of)
