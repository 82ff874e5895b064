"""StopMatcher: find stop strings in streamed text, holding back what might start one."""

from __future__ import annotations


class StopMatcher:
    """Feed text chunks; get back the text that is safe to emit and whether a stop string matched.

    A stop string may straddle chunks, so the longest tail of the pending text that is a prefix
    of some stop string is held back until the next chunk decides it. The stop string itself
    and everything after it are dropped.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._pending = ""
        self.matched: str | None = None  # the stop string that ended the output (the earliest in the text)

    def push(self, text: str) -> tuple[str, bool]:
        """Returns ``(text to emit, stopped)``; after ``stopped`` the matcher must not be used again."""
        if not self.stops:
            return text, False
        buffer = self._pending + text
        hits = [(i, s) for i, s in ((buffer.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            self._pending = ""
            at, self.matched = min(hits, key=lambda hit: hit[0])
            return buffer[:at], True
        hold = self._held_tail(buffer)
        self._pending = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold], False

    def flush(self) -> str:
        """End of output: the held-back text was not a stop string after all."""
        text, self._pending = self._pending, ""
        return text

    def _held_tail(self, buffer: str) -> int:
        longest = min(max(len(s) for s in self.stops) - 1, len(buffer))
        for n in range(longest, 0, -1):
            tail = buffer[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0
