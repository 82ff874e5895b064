"""Per-block sequence state: KV caches and double-buffered recurrent state.

State updates are explicit and transactional. A step writes *provisionally*:
- a :class:`KVCache` writes keys/values at the step's absolute positions; positions past a
  sequence's accepted length are ignored by the causal mask until the pipeline accepts them, so
  rollback needs no copy;
- a :class:`RecurrentState` reads the published buffer and writes the other one;
  :meth:`RecurrentState.publish` flips them, :meth:`RecurrentState.rollback` discards the write.
Nothing is hidden in module attributes: blocks receive their state as an argument.
"""

from __future__ import annotations

from typing import Protocol

import torch


class BlockState(Protocol):
    """What the pipeline needs from any block's state."""

    def publish(self) -> None: ...

    def rollback(self) -> None: ...

    def reset(self, slot: int) -> None:
        """Forget sequence ``slot`` (a new request starts there)."""
        ...

    @property
    def nbytes(self) -> int: ...

    def tensors(self) -> dict[str, torch.Tensor]:
        """Published contents, for equality checks and tests."""
        ...


class KVCache:
    """Keys and values of one attention block: ``(B, kv_heads, max_context, head_dim)`` each."""

    def __init__(self, batch: int, kv_heads: int, max_context: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (batch, kv_heads, max_context, head_dim)
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros(shape, dtype=dtype, device=device)
        self.max_context = max_context

    def write(self, positions: torch.Tensor, key: torch.Tensor, value: torch.Tensor, start: int | None) -> None:
        """Store ``key``/``value`` ``(B, kvH, T, D)`` at ``positions`` ``(B, T)``.

        ``start`` is set when every sequence's positions are ``start .. start+T-1`` (the common
        case), which allows a contiguous slice copy.
        """
        batch, _, steps, _ = key.shape
        if start is not None:
            self.key[:batch, :, start : start + steps].copy_(key)
            self.value[:batch, :, start : start + steps].copy_(value)
            return
        rows = torch.arange(batch, device=key.device)[:, None].expand(batch, steps)
        self.key[rows, :, positions] = key.transpose(1, 2)  # (B, T, kvH, D)
        self.value[rows, :, positions] = value.transpose(1, 2)

    def view(self, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the first ``length`` positions: ``(B, kvH, length, D)``."""
        return self.key[:batch, :, :length], self.value[:batch, :, :length]

    def publish(self) -> None:
        pass  # acceptance is the pipeline's position bookkeeping

    def rollback(self) -> None:
        pass  # provisional positions are masked until accepted

    def reset(self, slot: int) -> None:
        pass  # a new sequence writes from position 0; the causal mask hides the rest

    @property
    def nbytes(self) -> int:
        return 2 * self.key.numel() * self.key.element_size()  # key + value

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"key": self.key, "value": self.value}


class RecurrentState:
    """Double-buffered fixed-size state: named tensors, each stored as ``(2, *shape)``."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> None:
        self.buffers = {name: torch.zeros((2, *shape), dtype=dtype, device=device)
                        for name, (shape, dtype) in shapes.items()}
        self.active = 0  # index of the published buffer
        self._written = False

    def read(self, name: str) -> torch.Tensor:
        """The published value (do not modify in place)."""
        return self.buffers[name][self.active]

    def write(self, name: str, value: torch.Tensor) -> None:
        """Write the provisional value for this step."""
        self.buffers[name][1 - self.active][: value.shape[0]].copy_(value)
        self._written = True

    def provisional(self, name: str, batch: int) -> torch.Tensor:
        """The provisional buffer's first ``batch`` rows, for a kernel to write in place (marks it written)."""
        self._written = True
        return self.buffers[name][1 - self.active][:batch]

    def mark_written(self) -> None:
        """A replayed CUDA graph wrote the provisional buffer (no Python ran to note it)."""
        self._written = True

    def publish(self) -> None:
        if self._written:
            # the sequences not in this step keep their published rows
            self.active = 1 - self.active
            self._written = False

    def rollback(self) -> None:
        self._written = False

    def sync_rows(self, batch: int) -> None:
        """Copy the published rows past ``batch`` into the provisional buffer before a partial write."""
        for buf in self.buffers.values():
            if buf.shape[1] > batch:
                buf[1 - self.active][batch:].copy_(buf[self.active][batch:])

    def reset(self, slot: int) -> None:
        for buf in self.buffers.values():
            buf[:, slot].zero_()
        if all(buf.shape[1] == 1 for buf in self.buffers.values()):
            # the only slot: every sequence starts on buffer 0, so its steps alternate buffers exactly as
            # the last sequence's did and replay the same CUDA graphs (keyed by buffer parity)
            self.active = 0
            self._written = False

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: buf[self.active] for name, buf in self.buffers.items()}
