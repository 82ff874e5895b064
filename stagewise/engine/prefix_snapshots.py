"""PrefixSnapshots: the prefix cache's snapshots of recurrent state, for hybrid (linear-attention) models.

A linear-attention row's state is not in its KV blocks: sharing a cached prefix also needs that
state as it was at the prefix's end. While a prompt is prefilled, the step that crosses one of its
snapshot points (a KV block boundary: the prompt's last full block, and every ``interval`` blocks)
also writes the state there into a snapshot entry of every stage's state pools
(:class:`~stagewise.models.state_slots.StateSlots`); once that step is published the entry is keyed
by the prefix key of the block that ends there (:mod:`~stagewise.engine.block_hashes`). A later
sequence whose cached KV prefix reaches such a point starts from it: its row reads the snapshot
entry (a restore: no copy) and it prefills the rest, from that block boundary on.

Entries are few (each holds every linear-attention block's state: ~62 MiB for Qwen3.6) and
separate from KV blocks, so they have their own budget, evicted least recently used. An entry is in
exactly one state: free; pending (being written by a step not yet settled); cached (keyed, maybe
pinned by rows whose next step reads it). Pending and pinned entries are never evicted. The ids are
the same on every stage (the engine hands them out). Host integers only (no torch).
"""

from __future__ import annotations

from collections import OrderedDict, deque


class PrefixSnapshots:
    """Snapshot entries ``entries`` (a range of the stages' state entries), keyed, LRU (module doc);
    ``interval_blocks``: also snapshot every that many KV blocks along a prompt (0: only at its last
    full block)."""

    def __init__(self, entries: range, interval_blocks: int = 16) -> None:
        if interval_blocks < 0:
            raise ValueError(f"a snapshot interval is a number of blocks >= 0, got {interval_blocks}")
        self.entries = entries
        self.interval_blocks = interval_blocks
        self._free: deque[int] = deque(entries)
        self._pending: set[int] = set()
        self._by_key: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # keyed entries, least recently used first
        self._pins: dict[int, int] = {}  # keyed entry -> rows about to read it
        self.evictions = 0

    def __len__(self) -> int:
        """Snapshots keyed now."""
        return len(self._key_of)

    def lookup(self, key: bytes) -> int | None:
        """The entry keyed ``key`` (None: none), marked most recently used."""
        entry = self._by_key.get(key)
        if entry is not None and entry in self._idle:
            self._idle.move_to_end(entry)
        return entry

    def has(self, key: bytes) -> bool:
        return key in self._by_key

    def reserve(self) -> int | None:
        """An entry for a step to write a snapshot into (pending until :meth:`register` or
        :meth:`release`): a free one, else the least recently used unpinned one, evicted; None when
        every entry is pending or pinned."""
        if self._free:
            entry = self._free.popleft()
        elif self._idle:
            entry, _ = self._idle.popitem(last=False)
            del self._by_key[self._key_of.pop(entry)]
            self.evictions += 1
        else:
            return None
        self._pending.add(entry)
        return entry

    def register(self, entry: int, key: bytes) -> None:
        """``entry`` (pending) holds the state at the end of the block keyed ``key`` (its step is
        published): cached, most recently used. A key already cached keeps its entry; this one is freed."""
        self._pending.remove(entry)
        if key in self._by_key:
            self._free.append(entry)
            return
        self._by_key[key] = entry
        self._key_of[entry] = key
        self._idle[entry] = None

    def release(self, entry: int) -> None:
        """``entry`` (pending) was not written after all (its step failed): free again."""
        self._pending.remove(entry)
        self._free.append(entry)

    def pin(self, entry: int) -> None:
        """A row's next step reads ``entry`` (keyed): not evictable until :meth:`unpin`."""
        if entry not in self._key_of:
            raise ValueError(f"snapshot entry {entry} pinned but not cached")
        self._pins[entry] = self._pins.get(entry, 0) + 1
        self._idle.pop(entry, None)

    def unpin(self, entry: int) -> None:
        """One reader of ``entry`` is done (its step ran, or it ended)."""
        left = self._pins[entry] - 1
        if left:
            self._pins[entry] = left
            return
        del self._pins[entry]
        self._idle[entry] = None  # most recently used

    def check(self) -> None:
        """Raise AssertionError unless free, pending and cached partition the entries (tests)."""
        free, pending, cached = set(self._free), self._pending, set(self._key_of)
        assert not (free & pending) and not (free & cached) and not (pending & cached), "an entry in two states"
        assert free | pending | cached == set(self.entries) and len(self._free) == len(free), "entries lost"
        assert set(self._idle) | set(self._pins) == cached and not set(self._idle) & set(self._pins)
        assert all(self._by_key[k] == e for e, k in self._key_of.items()) and len(self._by_key) == len(self._key_of)
