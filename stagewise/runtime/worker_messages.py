"""Worker messages: what the coordinator and its workers say to each other through the TCPStore.

Everything is JSON (no pickle): a worker's :class:`JoinReport`, its :class:`Assignment`, each
:class:`Command` in one global sequence, and each worker's :class:`Ack`. Tensors that must reach
the coordinator (the exit's logits and features) travel as :func:`tensor_to_bytes` blobs.

Store keys (all under the coordinator's store):

- ``join/{rank}``: the latest JoinReport of that rank (a restarted worker overwrites it);
- ``assign/{rank}/{incarnation}``: the Assignment answering one JoinReport;
- ``cmd/{seq}``: Command number ``seq`` (every worker reads every command, in order);
- ``ack/{seq}/{rank}``, ``count/{seq}``, ``done/{seq}``: acknowledgements; ``done`` is set by the
  last acker (``all``), by a failing one (``fail``) or by the coordinator's watcher (``lost``);
- ``out/{seq}/{name}``: the exit's output tensors of a ``run`` command;
- ``hb/{rank}/{incarnation}``: a heartbeat counter the worker bumps every second.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from stagewise.runtime.stage import StageSpec

DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
               "int64": torch.int64}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def join_key(rank: int) -> str:
    return f"join/{rank}"


def assign_key(rank: int, incarnation: str) -> str:
    return f"assign/{rank}/{incarnation}"


def cmd_key(seq: int) -> str:
    return f"cmd/{seq}"


def ack_key(seq: int, rank: int) -> str:
    return f"ack/{seq}/{rank}"


def count_key(seq: int) -> str:
    return f"count/{seq}"


def done_key(seq: int) -> str:
    return f"done/{seq}"


def out_key(seq: int, name: str) -> str:
    return f"out/{seq}/{name}"


def heartbeat_key(rank: int, incarnation: str) -> str:
    return f"hb/{rank}/{incarnation}"


@dataclass(frozen=True)
class JoinReport:
    """A worker announcing itself: its rank, a fresh incarnation id, where it runs and its devices
    (a topology JSON object, device ids local to the worker)."""

    rank: int
    incarnation: str
    pid: int
    host: str
    topology: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> JoinReport:
        raw = json.loads(text)
        return JoinReport(int(raw["rank"]), str(raw["incarnation"]), int(raw["pid"]), str(raw["host"]),
                          dict(raw["topology"]))


@dataclass(frozen=True)
class Assignment:
    """What one worker runs: its stages (contiguous, possibly none) of ``model`` at ``dtype``, its
    place in the data process group (generation ``gen``), its neighbours' data ranks (``-1`` where
    it owns the entry / exit) and the first command it must read.

    Its readiness is acknowledged as ``ack/{first_seq - 1}/{rank}``.
    """

    model: str
    dtype: str
    batch: int
    context: int
    stages: tuple[StageSpec, ...]
    gen: int
    data_rank: int
    data_world: int
    backend: str
    prev_rank: int
    next_rank: int
    first_seq: int
    expected_acks: int
    timeout_s: float
    cuda_graphs: bool = True  # replay decode steps as CUDA graphs on GPU stages
    refused: str = ""  # non-empty: the coordinator will not use this worker (the message says why)

    def to_json(self) -> str:
        raw = asdict(self)
        raw["stages"] = [asdict(s) for s in self.stages]
        return json.dumps(raw)

    @staticmethod
    def from_json(text: str | bytes) -> Assignment:
        raw = json.loads(text)
        raw["stages"] = tuple(StageSpec(**s) for s in raw["stages"])
        return Assignment(**raw)


@dataclass(frozen=True)
class Command:
    """One coordinator command; ``members`` maps each rank to the incarnation the coordinator
    trusts (a worker not listed, or listed with another incarnation, has been replaced and exits).

    ``op``: ``run`` (step ``step_id`` over ``tokens``/``positions``), ``publish``, ``rollback``,
    ``reset`` (``slot``), ``regroup`` (rebuild the data group as generation ``gen``), ``exit``.
    Only ``run`` and ``regroup`` are acknowledged, by ``expected_acks`` workers.
    """

    seq: int
    op: str
    members: dict[int, str]
    step_id: int = 0
    tokens: list[list[int]] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    start: int | None = None
    all_logits: bool = False
    slot: int = 0
    gen: int = 0
    expected_acks: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> Command:
        raw = json.loads(text)
        raw["members"] = {int(k): str(v) for k, v in raw["members"].items()}
        return Command(**raw)


@dataclass(frozen=True)
class Ack:
    """A worker's answer to ``run`` / ``regroup`` (or to its assignment).

    ``error_type`` names the exception class; ``aborted`` means an upstream worker failed first.
    ``stage_s`` is compute time per owned stage, ``handoff_s`` the inbound transfer (header to checked activation), s.
    """

    rank: int
    ok: bool
    error: str = ""
    error_type: str = ""
    aborted: bool = False
    stage_s: list[float] = field(default_factory=list)
    handoff_s: float = 0.0
    measured_bytes: list[int] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> Ack:
        return Ack(**json.loads(text))


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """A JSON header line (shape, dtype) then the raw bytes of ``tensor`` (copied to the host)."""
    t = tensor.detach().cpu().contiguous()
    header = json.dumps({"shape": list(t.shape), "dtype": dtype_name(t.dtype)}).encode()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return header + b"\n" + raw


def tensor_from_bytes(blob: bytes) -> torch.Tensor:
    """Inverse of :func:`tensor_to_bytes`; bit-exact."""
    header, _, raw = blob.partition(b"\n")
    meta = json.loads(header)
    dtype = DTYPE_NAMES[meta["dtype"]]
    if not raw:
        return torch.empty(meta["shape"], dtype=dtype)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return flat.view(dtype).reshape(meta["shape"])
