"""WorkerLayout: which worker runs which stages of a distributed pipeline, and what each is told to load.

Fixed for the pipeline's life: a worker that rejoins gets the same assignment (a new generation and
first command number aside).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stagewise.runtime.stage import StageSpec
from stagewise.runtime.tensor_blob import dtype_name
from stagewise.runtime.worker_messages import Assignment


@dataclass(frozen=True)
class WorkerLayout:
    """Stages ``specs`` run by workers ``owners[k]`` (ranks >= 1), each stage holding ``batch`` state
    rows of ``context`` positions over ``kv_blocks`` KV blocks and ``snapshots`` prefix-snapshot entries;
    ``backend``: the data group's (``nccl`` / ``gloo``); ``timeout_s`` bounds a step and a data-group
    operation in the workers."""

    model: str
    specs: tuple[StageSpec, ...]
    owners: tuple[int, ...]
    dtype: torch.dtype
    batch: int
    context: int
    backend: str
    timeout_s: float
    cuda_graphs: bool
    kv_blocks: int
    snapshots: int
    packed_tokens: int = 0  # the most tokens a packed step carries (graph buckets); 0: packed steps eager

    def __post_init__(self) -> None:
        if len(self.specs) != len(self.owners):
            raise ValueError(f"{len(self.specs)} stages but {len(self.owners)} owners")
        if any(rank < 1 for rank in self.owners):
            raise ValueError(f"owners {list(self.owners)} must be worker ranks (>= 1; rank 0 coordinates)")

    def stages_of(self, rank: int) -> list[int]:
        """Indices of the stages worker ``rank`` runs."""
        return [s.index for s in self.specs if self.owners[s.index] == rank]

    @property
    def stepping_workers(self) -> int:
        """Workers that run stages (each keeps one step in flight: the pipeline's ``max_in_flight``)."""
        return len(set(self.owners))

    def assignment(self, rank: int, incarnation: str, gen: int, first_seq: int, data_world: int) -> Assignment:
        """Worker ``rank``'s stages and its neighbours in the data group of ``data_world`` workers (data ranks
        are ranks - 1), for data-group generation ``gen``; its first command is numbered ``first_seq``."""
        mine = tuple(s for s, r in zip(self.specs, self.owners, strict=True) if r == rank)
        prev = next_ = -1
        if mine:
            first, last = mine[0].index, mine[-1].index
            prev = self.owners[first - 1] - 1 if first > 0 else -1
            next_ = self.owners[last + 1] - 1 if last + 1 < len(self.specs) else -1
        return Assignment(incarnation=incarnation, model=self.model, dtype=dtype_name(self.dtype),  # type: ignore[arg-type]
                          batch=self.batch, context=self.context, stages=mine, gen=gen, data_rank=rank - 1,
                          data_world=data_world, backend=self.backend, prev_rank=prev, next_rank=next_,  # type: ignore[arg-type]
                          first_seq=first_seq, timeout_s=self.timeout_s, cuda_graphs=self.cuda_graphs,
                          kv_blocks=self.kv_blocks, snapshots=self.snapshots, packed_tokens=self.packed_tokens)
