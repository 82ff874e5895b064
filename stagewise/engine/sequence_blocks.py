"""SequenceBlocks: the batcher's paged-KV bookkeeping — which blocks of the pipeline's KV pool hold
each sequence's positions, and the pipeline block-table rows that name them.

One :class:`~stagewise.engine.prefix_cache.PrefixCache` hands out block ids, the same on every stage. A sequence gets its prefill's
blocks when it starts (:meth:`assign_prompt`), one more each time it crosses a block boundary while
decoding (:meth:`grant_next`), and gives them all back when it ends or is preempted (:meth:`release`),
its table row then pointing at the scratch block (padding steps in a free row write there). What to
do when no block is free (preempt the newest sequence) is the scheduler's policy, not this book's.
A pipeline without a KV pool keeps every row's whole context: every method is then a no-op or
answers as if blocks were unlimited.

With ``prefix_key`` (prefix caching, :class:`~stagewise.engine.prefix_cache.PrefixCache`) a starting
sequence first takes the cached blocks of the longest cached full-block prefix of its ids, capped so
that at least its last id is computed (its logits), and prefills from there; when its prefill is
published (:meth:`register_prompt`) its full prompt blocks are keyed for later sequences. Where the
stages hold recurrent state (``snapshots``, :class:`~stagewise.engine.prefix_snapshots.PrefixSnapshots`),
the prefix also needs that state at its end: the hit is cut back to the longest cached prefix that
ends where a snapshot is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stagewise.engine.block_hashes import block_hashes
from stagewise.engine.prefix_cache import PrefixCache, PrefixHit
from stagewise.engine.prefix_snapshots import PrefixSnapshots
from stagewise.errors import ContextLengthExceeded, StagewiseError

if TYPE_CHECKING:
    from stagewise.engine.sequence import Sequence
    from stagewise.runtime.executor import Executor


class SequenceBlocks:
    """The KV blocks of the sequences on ``pipeline``'s ``rows`` state rows (module doc)."""

    def __init__(self, pipeline: Executor, rows: int, prefix_key: bytes | None = None,
                 snapshots: PrefixSnapshots | None = None) -> None:
        self.pipeline = pipeline
        self.rows = rows
        self.pool = pipeline.kv_pool
        self.prefix_key = prefix_key if self.pool is not None else None  # the model's hash root; None: no prefix cache
        self.snapshots = snapshots if self.prefix_key is not None else None  # recurrent state at prefix ends
        self.allocator = self._new_allocator()
        self.queried_tokens = 0  # ids looked up in the prefix cache at admissions, since construction
        self.hit_tokens = 0  # of those, served from cached blocks

    def _new_allocator(self) -> PrefixCache | None:
        return PrefixCache(self.pool) if self.pool is not None else None

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The allocator where prefixes are cached (None when off, or without a pool)."""
        return self.allocator if self.prefix_key is not None else None

    @property
    def cached_blocks(self) -> int:
        """Blocks holding a keyed prefix (0 without a prefix cache)."""
        cache = self.prefix_cache
        return cache.cached_blocks if cache is not None else 0

    def clear(self) -> None:
        """Every block free and every row without blocks (the pipeline's identity table is not ours);
        the prefix cache (and its snapshots) is emptied."""
        if self.snapshots is not None:
            self.snapshots = PrefixSnapshots(self.snapshots.entries, self.snapshots.interval_blocks)
        if self.pool is not None:
            self.allocator = self._new_allocator()
            for row in range(self.rows):
                self.unassign(row)

    def unassign(self, row: int) -> None:
        """Point ``row``'s block-table row at the scratch block."""
        try:
            self.pipeline.set_blocks(row, [])
        except StagewiseError:
            # NOTE: a pipeline that refuses (a lost worker) keeps the stale row; harmless: a row is given
            # its blocks before it is stepped or moved onto, and without graphs no step pads with it
            pass

    @property
    def used_blocks(self) -> int:
        """Blocks held by live sequences (0 without a pool)."""
        return self.allocator.used_blocks if self.allocator is not None else 0

    @property
    def exhausted(self) -> bool:
        """No block is free (never without a pool)."""
        return self.allocator is not None and self.allocator.free_blocks == 0

    def sequence_tokens(self, max_context: int) -> int:
        """Positions one sequence may use: the context, and never more than the whole pool."""
        return max_context if self.pool is None else min(max_context, self.pool.tokens)

    def check_prompt(self, tokens: int) -> None:
        """Raise :class:`ContextLengthExceeded` when a prompt of ``tokens`` can never fit the pool."""
        if self.pool is not None and tokens >= self.pool.tokens:
            need = -(-tokens // self.pool.block_tokens)
            raise ContextLengthExceeded(f"the prompt has {tokens} tokens ({need} KV blocks of {self.pool.block_tokens}); "
                                        f"the KV pool holds {self.pool.blocks} blocks ({self.pool.tokens} tokens, --kv-tokens)")

    def fits(self, tokens: int) -> bool:
        """Whether the blocks of ``tokens`` positions are free now."""
        return self.allocator is None or self.allocator.blocks_for(tokens) <= self.allocator.free_blocks

    def _keys(self, seq: Sequence, ids: tuple[int, ...]) -> list[bytes]:
        """The prefix keys of ``ids``' full blocks, memoized on ``seq`` (its ids change only on a restart)."""
        assert self.prefix_key is not None and self.pool is not None
        if seq.prefix_keys_of != len(ids):
            seq.prefix_keys = tuple(block_hashes(self.prefix_key, ids, self.pool.block_tokens))
            seq.prefix_keys_of = len(ids)
        return list(seq.prefix_keys)

    def prefix_hit(self, seq: Sequence, ids: tuple[int, ...]) -> PrefixHit | None:
        """The cached prefix ``seq`` would start from with ``ids`` to prefill: full blocks only, and at
        least the last id left to compute (None without a prefix cache)."""
        cache = self.prefix_cache
        if cache is None or self.pool is None or not ids:
            return None
        cap = (len(ids) - 1) // self.pool.block_tokens  # blocks wholly before the last id
        keys = self._keys(seq, ids)
        hit = cache.lookup(keys[:cap])
        if self.snapshots is None:
            return hit
        cut = len(hit.blocks)
        while cut and not self.snapshots.has(keys[cut - 1]):
            cut -= 1  # the recurrent state is known only where a snapshot is
        seq.shared_tokens = len(hit.blocks) * self.pool.block_tokens  # where its prompt leaves the cached ones
        return hit if cut == len(hit.blocks) else cache.lookup(keys[:cut])

    def leader(self, seq: Sequence, ids: tuple[int, ...], prefilling: list[Sequence]) -> Sequence | None:
        """A prompt of ``prefilling`` (the staging rows: their blocks are cached once they join the
        decoding rows) whose full blocks ``ids`` shares beyond what the cache gives ``seq`` now: ``seq``
        had better wait for it than compute those blocks again (agents sharing a system prompt, sent at
        once). With recurrent state only while that prompt has not yet passed where the two part, and it
        is asked to snapshot there (:meth:`snapshot_point`); never without snapshot entries. None: start."""
        if not prefilling or self.prefix_cache is None or self.pool is None or (
                self.snapshots is not None and not self.snapshots.entries):
            return None  # (no prefix lookup on the admission path when nothing prefills)
        block = self.pool.block_tokens
        keys = self._keys(seq, ids)[: (len(ids) - 1) // block]  # as a hit is capped: the last id computed
        hit = self.hit_tokens_for(seq, ids) // block
        for other in prefilling:
            shared = 0
            for mine, theirs in zip(keys, self._keys(other, other.ids), strict=False):
                if mine != theirs:
                    break
                shared += 1
            if shared <= hit:
                continue
            if self.snapshots is None:
                return other
            point = shared * block
            if other.prefilled < point and other.shared_tokens <= other.prefilled:
                other.shared_tokens = point  # its own point is behind it and this one ahead: snapshot there
            if other.shared_tokens == point:
                return other
        return None

    def snapshot_key(self, seq: Sequence, tokens: int) -> bytes:
        """The prefix key of ``seq.ids``' first ``tokens`` positions (a multiple of the block): what a
        snapshot of the state there is keyed by."""
        assert self.pool is not None and tokens % self.pool.block_tokens == 0 and tokens > 0
        return self._keys(seq, seq.ids)[tokens // self.pool.block_tokens - 1]

    def snapshot_point(self, seq: Sequence, start: int, end: int) -> int | None:
        """Where a chunk of ``seq.ids`` from ``start`` to ``end`` should snapshot its recurrent state (one
        point a chunk, in ``(start, end]``; None: none lies there, or no snapshots): first the end of the
        cached KV prefix it shares with earlier prompts past their last snapshot (where prompts that
        share a system prompt part: the next such prompt starts there), or where a prompt waiting for it
        parts from it (:meth:`leader`), else the later of the prompt's
        last full block (the next turn of a chat continues it) and every ``interval_blocks`` blocks."""
        if self.snapshots is None or self.pool is None:
            return None
        if start < seq.shared_tokens <= end:
            return seq.shared_tokens
        block = self.pool.block_tokens
        last_full = len(seq.ids) // block * block
        points = [last_full] if start < last_full <= end else []
        if self.snapshots.interval_blocks:
            step = self.snapshots.interval_blocks * block
            points.append(end // step * step)
        best = max((p for p in points if start < p <= end), default=None)
        return best

    def hit_tokens_for(self, seq: Sequence, ids: tuple[int, ...]) -> int:
        """Positions of ``ids`` a start now would take from the cache."""
        hit = self.prefix_hit(seq, ids)
        return hit.tokens(self.pool.block_tokens) if hit is not None and self.pool is not None else 0

    def fits_start(self, seq: Sequence, ids: tuple[int, ...]) -> bool:
        """Whether ``seq`` can start now with ``ids``: the blocks past its cached prefix are free or
        evictable without evicting that prefix."""
        hit = self.prefix_hit(seq, ids)
        if hit is None or self.allocator is None:
            return self.fits(len(ids))
        need = self.allocator.blocks_for(len(ids)) - len(hit.blocks)
        return need + hit.idle <= self.allocator.free_blocks

    def assign_prompt(self, seq: Sequence) -> int:
        """Give ``seq`` the blocks of its prefill (``seq.ids``), the cached prefix's first (shared);
        :meth:`name_blocks` puts them in its row. Returns the positions served from the cache."""
        if self.allocator is None:
            return 0
        hit = self.prefix_hit(seq, seq.ids)
        cache = self.prefix_cache
        if hit is None or cache is None:
            seq.blocks = self.allocator.allocate(self.allocator.blocks_for(len(seq.ids)))
            return 0
        shared = cache.acquire(hit)  # first: held, so allocating the rest cannot evict them
        seq.blocks = shared + cache.allocate(cache.blocks_for(len(seq.ids)) - len(shared))
        cached = hit.tokens(cache.pool.block_tokens)
        self.queried_tokens += len(seq.ids)
        self.hit_tokens += cached
        return cached

    def register_prompt(self, seq: Sequence) -> None:
        """Key ``seq``'s full blocks of ``seq.ids`` (its prefill is published: nothing in flight)."""
        cache = self.prefix_cache
        if cache is not None and seq.blocks and seq.prefilled >= len(seq.ids):
            keys = self._keys(seq, seq.ids)
            cache.register(seq.blocks[: len(keys)], keys)

    def name_blocks(self, seq: Sequence) -> None:
        """Write ``seq``'s blocks into its block-table row (may raise: a lost worker refuses it)."""
        if self.allocator is not None:
            self.pipeline.set_blocks(seq.row, seq.blocks)

    def needs_block(self, seq: Sequence) -> bool:
        """Whether ``seq``'s next position lies past the blocks it holds."""
        return self.pool is not None and seq.length >= len(seq.blocks) * self.pool.block_tokens

    def grant_next(self, seq: Sequence) -> None:
        """One more block for ``seq`` (one must be free), written into its row."""
        assert self.allocator is not None
        seq.blocks += self.allocator.allocate(1)
        self.pipeline.set_blocks(seq.row, seq.blocks)

    def release(self, seq: Sequence) -> None:
        """``seq``'s blocks back to the pool, its row to the scratch block."""
        if self.allocator is not None and seq.blocks:
            self.allocator.release(seq.blocks)
            seq.blocks = []
            self.unassign(seq.row)
