"""Worker messages: what the coordinator and its workers say to each other on the control plane.

One frozen :class:`msgspec.Struct` per operation, tagged by ``op`` and encoded as MessagePack (no
pickle). Decoding validates every type, range and length (the ``Meta`` constraints below) and each
message's own invariants (``__post_init__``), so a malformed message raises before anything acts on
it; :class:`~stagewise.runtime.message_seal.MessageSeal` turns that into
:class:`WorkerMessageRejected` and signs and checks every message.

Down (coordinator -> one worker): :class:`Assignment`, :class:`ProbeRequest` and the
:data:`Command` union (:class:`Run`, :class:`Publish`, :class:`Rollback`, :class:`Regroup`,
:class:`Exit`), each numbered ``seq`` in one global order; the row operations of continuous
batching (:data:`RowOp`) ride inside a :class:`Run`. Up (worker -> coordinator): :class:`JoinReport`,
:class:`Ack` (with the exit's outputs as :class:`TensorBlob`), :class:`Heartbeat`, :class:`ProbeDone`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from stagewise.models.step_layout import StepLayout
from stagewise.runtime.link_probe import LinkProbe, ProbeReport
from stagewise.runtime.stage import StageSpec
from stagewise.runtime.tensor_blob import TensorBlob

MAX_RANK = 4096
MAX_INT = 2**62
MAX_TEXT = 64 * 1024  # an error message, a host name...

Rank = Annotated[int, Meta(ge=1, le=MAX_RANK)]
Neighbour = Annotated[int, Meta(ge=-1, le=MAX_RANK)]  # a data rank, -1: none
Row = Annotated[int, Meta(ge=0, le=MAX_RANK)]
Count = Annotated[int, Meta(ge=0, le=MAX_INT)]
StepId = Annotated[int, Meta(ge=1, le=MAX_INT)]
Token = Annotated[int, Meta(ge=0, le=2**31 - 1)]  # a token id or a position
BlockId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
Seconds = Annotated[float, Meta(ge=0.0, le=1e9)]
Incarnation = Annotated[str, Meta(pattern="^[0-9a-f]{32}$")]
Text = Annotated[str, Meta(max_length=MAX_TEXT)]
Grid = Annotated[list[Annotated[list[Token], Meta(min_length=1, max_length=2**20)]], Meta(min_length=1, max_length=2**20)]


class _Message(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="op"):
    pass


# ----- row operations (ride inside a Run) ----------------------------------------------------------


class Reset(_Message, tag="reset", frozen=True, kw_only=True):
    """Start a new sequence in row ``slot``."""

    slot: Row

    @property
    def named_rows(self) -> list[int]:
        return [self.slot]


class SetBlocks(_Message, tag="set_blocks", frozen=True, kw_only=True):
    """Row ``slot``'s KV lives in ``blocks``."""

    slot: Row
    blocks: Annotated[list[BlockId], Meta(max_length=2**20)]

    @property
    def named_rows(self) -> list[int]:
        return [self.slot]


class Move(_Message, tag="move", frozen=True, kw_only=True):
    """Row ``src``'s KV blocks and recurrent entries become row ``dst``'s."""

    src: Row
    dst: Row

    @property
    def named_rows(self) -> list[int]:
        return [self.src, self.dst]


class Restore(_Message, tag="restore", frozen=True, kw_only=True):
    """Row ``slot``'s next step reads recurrent entry ``entry`` (a prefix snapshot)."""

    slot: Row
    entry: BlockId

    @property
    def named_rows(self) -> list[int]:
        return [self.slot]


RowOp = Reset | SetBlocks | Move | Restore


# ----- commands (every member, in ``seq`` order) ----------------------------------------------------


class _Command(_Message, frozen=True, kw_only=True):
    """``members``: the incarnation the coordinator trusts per rank (a worker not listed, or listed
    with another incarnation, was replaced and exits); ``publish``: steps published since the last
    command, which the worker publishes first."""

    seq: Count
    members: Annotated[dict[Rank, Incarnation], Meta(max_length=MAX_RANK)]
    publish: Annotated[list[StepId], Meta(max_length=MAX_RANK)] = []


class Run(_Command, tag="run", frozen=True, kw_only=True):
    """Step ``step_id`` over ``tokens``/``positions`` ``(B, T)`` in rows ``first_row ..``, or a packed
    step (``layout``: ``(N, 1)`` tokens). ``tokens_of`` instead of ``tokens``: one token a row, the
    greedy tokens of step ``tokens_of`` over the same rows, which the worker running the entry (and
    the exit) kept on its device (:class:`~stagewise.runtime.worker_tokens.WorkerTokens`). ``ops``: row
    operations applied first, in order. ``greedy``: the exit answers each row's greedy (token,
    log-probability), not the logits; ``eager``: never a CUDA graph."""

    step_id: StepId
    positions: Grid
    tokens: Grid | None = None
    tokens_of: StepId | None = None
    start: Token | None = None
    all_logits: bool = False
    first_row: Row = 0
    eager: bool = False
    greedy: bool = False
    layout: StepLayout | None = None
    ops: Annotated[list[RowOp], Meta(max_length=2**16)] = []

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.tokens_of is None):
            raise ValueError("a run takes either tokens or tokens_of")
        if self.tokens_of is not None:
            if self.tokens_of >= self.step_id or self.layout is not None or any(len(r) != 1 for r in self.positions):
                raise ValueError("tokens_of names an earlier step's tokens, one a row of a rectangle")
            return
        assert self.tokens is not None
        if [len(r) for r in self.tokens] != [len(r) for r in self.positions]:
            raise ValueError("tokens and positions differ in shape")
        if len({len(r) for r in self.tokens}) != 1:
            raise ValueError("a run needs a rectangle of tokens")
        if self.layout is not None and (len(self.tokens) != self.layout.tokens or len(self.tokens[0]) != 1):
            raise ValueError(f"{len(self.tokens)} tokens for a packed step of {self.layout.tokens}")

    @property
    def rows(self) -> frozenset[int]:
        if self.layout is not None:
            return frozenset(self.layout.rows)
        return frozenset(range(self.first_row, self.first_row + len(self.positions)))


class Publish(_Command, tag="publish", frozen=True, kw_only=True):
    """Publish step ``step_id`` (0: every unsettled step)."""

    step_id: Count = 0


class Rollback(_Command, tag="rollback", frozen=True, kw_only=True):
    """Roll back step ``step_id`` (0: every unsettled step)."""

    step_id: Count = 0


class Regroup(_Command, tag="regroup", frozen=True, kw_only=True):
    """Rebuild the data process group as generation ``gen`` (acknowledged)."""

    gen: Count


class Exit(_Command, tag="exit", frozen=True, kw_only=True):
    """Leave."""


Command = Run | Publish | Rollback | Regroup | Exit
ACKNOWLEDGED = (Run, Regroup)  # the commands each worker answers with an Ack


class Assignment(_Message, tag="assign", frozen=True, kw_only=True):
    """What worker incarnation ``incarnation`` runs: its stages (contiguous, possibly none) of ``model``
    at ``dtype``, its place in the data group (generation ``gen``), its neighbours' data ranks (-1
    where it owns the entry / exit) and the first command it executes. Its readiness is acknowledged
    as command ``first_seq - 1``. ``refused`` non-empty: not used (the text says why)."""

    incarnation: Incarnation
    model: Text
    dtype: Literal["float32", "bfloat16", "float16"]
    batch: Rank
    context: Annotated[int, Meta(ge=1, le=MAX_INT)]
    stages: Annotated[tuple[StageSpec, ...], Meta(max_length=MAX_RANK)]
    gen: Count
    data_rank: Annotated[int, Meta(ge=0, le=MAX_RANK)]
    data_world: Rank
    backend: Literal["gloo", "nccl"]
    prev_rank: Neighbour
    next_rank: Neighbour
    first_seq: Annotated[int, Meta(ge=1, le=MAX_INT)]
    timeout_s: Annotated[float, Meta(ge=1e-3, le=1e9)]
    cuda_graphs: bool = True  # replay decode steps as CUDA graphs on GPU stages
    refused: Text = ""
    kv_blocks: BlockId = 0  # usable KV blocks of every stage's pool; 0: every row its whole context
    snapshots: BlockId = 0  # prefix-snapshot entries of every stage's recurrent state
    packed_tokens: BlockId = 0  # the most tokens a packed step carries (its graph buckets); 0: packed steps eager

    def __post_init__(self) -> None:
        if not (self.data_rank < self.data_world and self.prev_rank < self.data_world
                and self.next_rank < self.data_world):
            raise ValueError(f"data ranks {self.data_rank}, {self.prev_rank}, {self.next_rank} outside a group of "
                             f"{self.data_world}")


class ProbeRequest(_Message, tag="probe", frozen=True, kw_only=True):
    """Time the links of ``probe`` (sent to incarnation ``incarnation`` before it is assigned)."""

    incarnation: Incarnation
    probe: LinkProbe


Down = Assignment | ProbeRequest | Run | Publish | Rollback | Regroup | Exit


# ----- worker -> coordinator ------------------------------------------------------------------------


class JoinReport(_Message, tag="join", frozen=True, kw_only=True):
    """A worker announcing itself: its rank, a fresh incarnation id, where it runs and its devices
    (a topology JSON object, device ids local to the worker)."""

    rank: Rank
    incarnation: Incarnation
    pid: Annotated[int, Meta(ge=1, le=2**31)]
    host: Annotated[str, Meta(max_length=255)]
    topology: dict[str, Any]


class Ack(_Message, tag="ack", frozen=True, kw_only=True):
    """Worker ``rank``'s answer to command ``seq`` (a run, a regroup, or its assignment as
    ``first_seq - 1``). ``error_type`` names the exception class; ``aborted``: an upstream worker
    failed first. ``stage_s``: compute time per owned stage, ``handoff_s``: the inbound transfer.
    The exit's worker sends ``pairs`` (greedy (token, log-probability) per row, for a greedy run)
    or ``hidden`` and ``logits``."""

    seq: Count
    rank: Rank
    incarnation: Incarnation
    ok: bool
    error: Text = ""
    error_type: Annotated[str, Meta(max_length=200, pattern="^([A-Za-z_][A-Za-z0-9_]*)?$")] = ""
    aborted: bool = False
    stage_s: Annotated[list[Seconds], Meta(max_length=MAX_RANK)] = []
    handoff_s: Seconds = 0.0
    measured_bytes: Annotated[list[Count], Meta(max_length=MAX_RANK)] = []
    pairs: Annotated[list[tuple[Annotated[float, Meta(ge=0, lt=2**31)], float]], Meta(max_length=MAX_RANK)] = []
    hidden: TensorBlob | None = None
    logits: TensorBlob | None = None

    def __post_init__(self) -> None:
        if any(not token.is_integer() for token, _ in self.pairs):
            raise ValueError("pairs hold a token id that is not an integer")


class Heartbeat(_Message, tag="beat", frozen=True, kw_only=True):
    """Beat number ``n`` (strictly increasing per incarnation) of a live worker."""

    rank: Rank
    incarnation: Incarnation
    n: Count


class ProbeDone(_Message, tag="probe_done", frozen=True, kw_only=True):
    """A worker's figures for link probe ``report``'s request."""

    incarnation: Incarnation
    n: Count
    report: ProbeReport


Up = JoinReport | Ack | Heartbeat | ProbeDone


class PlaneAddress(_Message, tag="plane", frozen=True, kw_only=True):
    """Where the coordinator's control plane listens: ``port`` on the host the store was reached at
    (published once, signed, in the rendezvous store)."""

    port: Annotated[int, Meta(ge=1, le=65535)]
