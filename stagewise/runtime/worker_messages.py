"""Worker messages: what the coordinator and its workers say to each other through the TCPStore.

Everything is JSON (no pickle): a worker's :class:`JoinReport`, its :class:`Assignment`, each
:class:`Command` in one global sequence, and each worker's :class:`Ack`. Tensors that must reach
the coordinator (the exit's logits and features) travel as :func:`tensor_to_bytes` blobs. Every
value is signed (:class:`~stagewise.runtime.sealed_store.SealedStore`), and every ``from_json`` /
:func:`tensor_from_bytes` checks types, sizes and ranges before anything acts on a message,
raising :class:`WorkerMessageRejected` otherwise.

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
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from stagewise.errors import WorkerMessageRejected
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.stage import StageSpec

DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
               "int64": torch.int64}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


MAX_RANK = 4096
MAX_INT = 2**62
OPS = ("run", "publish", "rollback", "reset", "set_blocks", "move", "restore", "regroup", "exit")
ROW_OPS = ("reset", "set_blocks", "move", "restore")  # rearrange state rows; acknowledged like run
MAX_BLOCKS = 2**31 - 1  # a KV block id
MAX_INT_LIST = 2**20  # block ids of one row
MAX_ROW_OPS = 2**16  # row operations riding on one run
BACKENDS = ("gloo", "nccl")
MAX_TEXT = 64 * 1024  # an error message, a host name...


def _load(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WorkerMessageRejected(f"{what}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise WorkerMessageRejected(f"{what}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _only(raw: dict[str, Any], cls: type, what: str) -> None:
    known = {f.name for f in fields(cls)}
    extra = set(raw) - known
    if extra:
        raise WorkerMessageRejected(f"{what}: unknown field(s) {sorted(extra)}")


def _int(raw: dict[str, Any], name: str, what: str, lo: int = -MAX_INT, hi: int = MAX_INT,
         default: int | None = None) -> int:
    value = raw.get(name, default)
    if type(value) is not int or not lo <= value <= hi:
        raise WorkerMessageRejected(f"{what}: {name} must be an integer in [{lo}, {hi}], got {value!r}"[:300])
    return value


def _opt_int(raw: dict[str, Any], name: str, what: str, lo: int, hi: int) -> int | None:
    return None if raw.get(name) is None else _int(raw, name, what, lo, hi)


def _bool(raw: dict[str, Any], name: str, what: str, default: bool | None = None) -> bool:
    value = raw.get(name, default)
    if type(value) is not bool:
        raise WorkerMessageRejected(f"{what}: {name} must be true or false, got {value!r}"[:300])
    return value


def _float(value: Any, name: str, what: str, lo: float = 0.0, hi: float = 1e9) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not lo <= value <= hi:
        raise WorkerMessageRejected(f"{what}: {name} must be a number in [{lo:g}, {hi:g}], got {value!r}"[:300])
    return float(value)


def _str(raw: dict[str, Any], name: str, what: str, default: str | None = None, limit: int = MAX_TEXT) -> str:
    value = raw.get(name, default)
    if not isinstance(value, str) or len(value) > limit:
        raise WorkerMessageRejected(f"{what}: {name} must be a string of at most {limit} characters")
    return value


def _incarnation(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
        raise WorkerMessageRejected(f"{what}: an incarnation is 32 hex digits, got {value!r}"[:300])
    return value


def _int_rows(raw: dict[str, Any], name: str, what: str, lo: int, hi: int) -> list[list[int]]:
    rows = raw.get(name, [])
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise WorkerMessageRejected(f"{what}: {name} must be a list of lists of integers")
    for row in rows:
        for v in row:
            if type(v) is not int or not lo <= v <= hi:
                raise WorkerMessageRejected(f"{what}: {name} holds {v!r}, not an integer in [{lo}, {hi}]"[:300])
    return rows


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
        what = "join report"
        raw = _load(text, what)
        _only(raw, JoinReport, what)
        topology = raw.get("topology")
        if not isinstance(topology, dict):
            raise WorkerMessageRejected(f"{what}: topology must be a JSON object")
        return JoinReport(_int(raw, "rank", what, 1, MAX_RANK), _incarnation(raw.get("incarnation"), what),
                          _int(raw, "pid", what, 1, 2**31), _str(raw, "host", what, limit=255), topology)


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
    kv_blocks: int = 0  # usable KV blocks of every stage's pool; 0: every one of ``batch`` rows its whole context
    snapshots: int = 0  # prefix-snapshot entries of every stage's recurrent state

    def to_json(self) -> str:
        raw = asdict(self)
        raw["stages"] = [asdict(s) for s in self.stages]
        return json.dumps(raw)

    @staticmethod
    def from_json(text: str | bytes) -> Assignment:
        what = "assignment"
        raw = _load(text, what)
        _only(raw, Assignment, what)
        stages = raw.get("stages")
        if not isinstance(stages, list) or len(stages) > MAX_RANK:
            raise WorkerMessageRejected(f"{what}: stages must be a list")
        world = _int(raw, "data_world", what, 1, MAX_RANK)
        dtype = _str(raw, "dtype", what)
        if dtype not in DTYPE_NAMES:
            raise WorkerMessageRejected(f"{what}: unknown dtype {dtype!r}"[:300])
        backend = _str(raw, "backend", what)
        if backend not in BACKENDS:
            raise WorkerMessageRejected(f"{what}: unknown backend {backend!r}"[:300])
        return Assignment(
            _str(raw, "model", what), dtype, _int(raw, "batch", what, 1, MAX_RANK),
            _int(raw, "context", what, 1, MAX_INT), tuple(_stage_spec(s, what) for s in stages),
            _int(raw, "gen", what, 0, MAX_INT), _int(raw, "data_rank", what, 0, world - 1), world, backend,
            _int(raw, "prev_rank", what, -1, world - 1), _int(raw, "next_rank", what, -1, world - 1),
            _int(raw, "first_seq", what, 1, MAX_INT), _int(raw, "expected_acks", what, 0, MAX_RANK),
            _float(raw.get("timeout_s"), "timeout_s", what, 1e-3), _bool(raw, "cuda_graphs", what, True),
            _str(raw, "refused", what, ""), _int(raw, "kv_blocks", what, 0, MAX_BLOCKS, 0),
            _int(raw, "snapshots", what, 0, MAX_BLOCKS, 0))


@dataclass(frozen=True)
class Command:
    """One coordinator command; ``members`` maps each rank to the incarnation the coordinator
    trusts (a worker not listed, or listed with another incarnation, has been replaced and exits).

    ``op``: ``run`` (step ``step_id`` over ``tokens``/``positions`` ``(B, T)`` in state rows
    ``first_row ..``, or a packed step: ``(N, 1)`` tokens laid out by ``layout`` — its segments'
    rows, starts, lengths, the segments with logits, ``[decoding]`` and its snapshots flattened
    ``(segment, tokens, entry)`` after another, as :class:`StepLayout` holds them), ``publish``,
    ``rollback``, the row operations of :data:`ROW_OPS` — ``reset`` (row ``slot``), ``set_blocks``
    (row ``slot``'s KV in ``blocks``), ``move`` (row ``src``'s KV blocks and recurrent entries to row
    ``dst``), ``restore`` (row ``slot``'s next step reads recurrent entry ``entry``) —
    ``regroup`` (rebuild the data group as generation ``gen``), ``exit``. ``run``, the row
    operations and ``regroup`` are acknowledged, by ``expected_acks`` workers. A ``run`` carries the
    row operations decided since the last run in ``ops`` (each a row-operation command, checked by the
    coordinator first): every worker applies them in order before the step, in stream order with it.
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
    first_row: int = 0
    rows: int = 0
    blocks: list[int] = field(default_factory=list)
    src: int = 0
    dst: int = 0
    entry: int = 0
    layout: list[list[int]] = field(default_factory=list)  # run: a packed step's [rows, starts, lengths, logits, [decoding]]
    eager: bool = False  # run: never replay (or capture) a CUDA graph for this step
    greedy: bool = False  # run: the exit sends each row's greedy (token, log-probability), not the logits
    publish: list[int] = field(default_factory=list)  # any op: steps to publish first (decided since the last command)
    ops: list[Command] = field(default_factory=list)  # run: row operations to apply first, in order (no round trip)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def step_layout(self) -> StepLayout | None:
        """A packed run's :class:`StepLayout` (None: a rectangle); :class:`WorkerMessageRejected` when
        the layout names no step (its checks) or does not fit the run's tokens."""
        if not self.layout:
            return None
        rows, starts, lengths, logits, (decoding,), flat = self.layout
        snapshots = tuple((flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3))
        try:
            layout = StepLayout(tuple(rows), tuple(starts), tuple(lengths), tuple(logits), decoding, snapshots)
        except ValueError as exc:
            raise WorkerMessageRejected(f"step {self.step_id}: {exc}") from None
        if len(self.tokens) != layout.tokens or any(len(r) != 1 for r in self.tokens):
            raise WorkerMessageRejected(f"step {self.step_id}: {len(self.tokens)} tokens for a packed step of {layout.tokens}")
        return layout

    @staticmethod
    def layout_fields(layout: StepLayout) -> list[list[int]]:
        """``layout`` as a run carries it."""
        return [list(layout.rows), list(layout.starts), list(layout.lengths), list(layout.logits), [layout.decoding],
                [n for snapshot in layout.snapshots for n in snapshot]]

    def named_rows(self) -> list[int]:
        """The rows a row operation names: the row it resets or gives blocks, a move's source and
        destination."""
        return {"reset": [self.slot], "set_blocks": [self.slot], "move": [self.src, self.dst],
                "restore": [self.slot]}[self.op]

    @staticmethod
    def from_json(text: str | bytes, seq: int | None = None) -> Command:
        """Parse and check a command; ``seq``: the number it must carry (the key it was read at)."""
        what = "command"
        raw = _load(text, what)
        _only(raw, Command, what)
        got = _int(raw, "seq", what, 0, MAX_INT)
        if seq is not None and got != seq:
            raise WorkerMessageRejected(f"{what}: numbered {got}, read as command {seq}")
        op = _str(raw, "op", what)
        if op not in OPS:
            raise WorkerMessageRejected(f"{what}: unknown op {op!r}"[:300])
        members = raw.get("members")
        if not isinstance(members, dict) or len(members) > MAX_RANK:
            raise WorkerMessageRejected(f"{what}: members must be an object")
        checked: dict[int, str] = {}
        for k, v in members.items():
            if not k.isdigit() or not 1 <= int(k) <= MAX_RANK:
                raise WorkerMessageRejected(f"{what}: member rank {k!r} is not in [1, {MAX_RANK}]"[:300])
            checked[int(k)] = _incarnation(v, what)
        tokens = _int_rows(raw, "tokens", what, 0, 2**31 - 1)
        positions = _int_rows(raw, "positions", what, 0, 2**31 - 1)
        if [len(r) for r in tokens] != [len(r) for r in positions] and op == "run":
            raise WorkerMessageRejected(f"{what}: tokens and positions differ in shape")
        if op == "run" and (not tokens or len({len(r) for r in tokens}) != 1 or not tokens[0]):
            raise WorkerMessageRejected(f"{what}: a run needs a non-empty rectangle of tokens")
        blocks = raw.get("blocks", [])
        if not isinstance(blocks, list) or len(blocks) > MAX_INT_LIST:
            raise WorkerMessageRejected(f"{what}: blocks must be a list of at most {MAX_INT_LIST} block ids")
        for b in blocks:
            if type(b) is not int or not 0 <= b <= MAX_BLOCKS:
                raise WorkerMessageRejected(f"{what}: blocks holds {b!r}, not a block id"[:300])
        publish = raw.get("publish", [])
        if not isinstance(publish, list) or len(publish) > MAX_RANK:
            raise WorkerMessageRejected(f"{what}: publish must be a list of at most {MAX_RANK} step ids")
        if any(type(p) is not int or not 1 <= p <= MAX_INT for p in publish):
            raise WorkerMessageRejected(f"{what}: publish holds {publish[:4]!r}..., not step ids"[:300])
        ops = raw.get("ops", [])
        if not isinstance(ops, list) or len(ops) > MAX_ROW_OPS or (ops and op != "run"):
            raise WorkerMessageRejected(f"{what}: ops must be a list of at most {MAX_ROW_OPS} row operations, on a run")
        nested = [Command.from_json(json.dumps(o)) if isinstance(o, dict) and not o.get("ops") else None for o in ops]
        if any(o is None or o.op not in ROW_OPS for o in nested):
            raise WorkerMessageRejected(f"{what}: ops holds something other than a row operation")
        rows = _int(raw, "rows", what, 0, MAX_RANK, 0)
        layout = _int_rows(raw, "layout", what, 0, 2**31 - 1)
        if layout and (op != "run" or len(layout) != 6 or len(layout[4]) != 1 or len(layout[5]) % 3):
            raise WorkerMessageRejected(f"{what}: a layout is [rows, starts, lengths, logits, [decoding], snapshots], on a run")
        return Command(got, op, checked, _int(raw, "step_id", what, 0, MAX_INT, 0), tokens, positions,
                       _opt_int(raw, "start", what, 0, 2**31 - 1), _bool(raw, "all_logits", what, False),
                       _int(raw, "slot", what, 0, MAX_RANK, 0), _int(raw, "gen", what, 0, MAX_INT, 0),
                       _int(raw, "expected_acks", what, 0, MAX_RANK, 0), _int(raw, "first_row", what, 0, MAX_RANK, 0),
                       rows, blocks, _int(raw, "src", what, 0, MAX_RANK, 0), _int(raw, "dst", what, 0, MAX_RANK, 0),
                       _int(raw, "entry", what, 0, MAX_BLOCKS, 0), layout, _bool(raw, "eager", what, False),
                       _bool(raw, "greedy", what, False), publish, [o for o in nested if o is not None])


@dataclass(frozen=True)
class Ack:
    """A worker's answer to ``run`` / ``regroup`` (or to its assignment).

    ``error_type`` names the exception class; ``aborted`` means an upstream worker failed first.
    ``stage_s`` is compute time per owned stage, ``handoff_s`` the inbound transfer (header to checked activation), s.
    ``pairs``: the exit's greedy ``(token, log-probability)`` per row, for a ``run`` asked for those only.
    """

    rank: int
    ok: bool
    error: str = ""
    error_type: str = ""
    aborted: bool = False
    stage_s: list[float] = field(default_factory=list)
    handoff_s: float = 0.0
    measured_bytes: list[int] = field(default_factory=list)
    pairs: list[list[float]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes, rank: int | None = None) -> Ack:
        """Parse and check an acknowledgement; ``rank``: the worker it must come from."""
        what = "acknowledgement"
        raw = _load(text, what)
        _only(raw, Ack, what)
        got = _int(raw, "rank", what, 1, MAX_RANK)
        if rank is not None and got != rank:
            raise WorkerMessageRejected(f"{what}: from rank {got}, read as rank {rank}'s")
        error_type = _str(raw, "error_type", what, "", limit=200)
        if error_type and not error_type.isidentifier():
            raise WorkerMessageRejected(f"{what}: error_type {error_type!r} is not a class name"[:300])
        stage_s, sizes = raw.get("stage_s", []), raw.get("measured_bytes", [])
        if not isinstance(stage_s, list) or not isinstance(sizes, list) or len(stage_s) + len(sizes) > 2 * MAX_RANK:
            raise WorkerMessageRejected(f"{what}: stage_s and measured_bytes must be lists")
        for v in sizes:
            if type(v) is not int or not 0 <= v <= MAX_INT:
                raise WorkerMessageRejected(f"{what}: measured_bytes holds {v!r}"[:300])
        pairs = raw.get("pairs", [])
        if not isinstance(pairs, list) or len(pairs) > MAX_RANK:
            raise WorkerMessageRejected(f"{what}: pairs must be a list of at most {MAX_RANK} rows")
        for pair in pairs:  # a token id, then any log-probability (a broken model's may be NaN)
            if not isinstance(pair, list) or len(pair) != 2 or type(pair[0]) is not float or \
                    not (pair[0].is_integer() and 0 <= pair[0] < 2**31) or type(pair[1]) not in (int, float):
                raise WorkerMessageRejected(f"{what}: pairs holds {pair!r}, not (token, log-probability)"[:300])
        return Ack(got, _bool(raw, "ok", what), _str(raw, "error", what, ""), error_type,
                   _bool(raw, "aborted", what, False), [_float(v, "stage_s", what) for v in stage_s],
                   _float(raw.get("handoff_s", 0.0), "handoff_s", what), sizes, pairs)


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """A JSON header line (shape, dtype) then the raw bytes of ``tensor`` (copied to the host)."""
    t = tensor.detach().cpu().contiguous()
    header = json.dumps({"shape": list(t.shape), "dtype": dtype_name(t.dtype)}).encode()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return header + b"\n" + raw


def tensor_from_bytes(blob: bytes) -> torch.Tensor:
    """Inverse of :func:`tensor_to_bytes`; bit-exact. :class:`WorkerMessageRejected` when the header
    is malformed or the bytes do not match its shape and dtype."""
    header, _, raw = blob.partition(b"\n")
    meta = _load(header, "tensor header")
    dtype = DTYPE_NAMES.get(meta.get("dtype"))  # type: ignore[arg-type]
    shape = meta.get("shape")
    if dtype is None or not isinstance(shape, list) or len(shape) > 8 or \
            not all(type(d) is int and 0 <= d <= MAX_INT for d in shape):
        raise WorkerMessageRejected(f"tensor header: bad dtype or shape ({header[:200]!r})")
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise WorkerMessageRejected(f"tensor: {len(raw)} bytes for shape {shape} {meta['dtype']} ({expected} expected)")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def _kv_dtype(value: Any, what: str) -> str | None:
    if value is not None and value != "fp8":
        raise WorkerMessageRejected(f"{what}: kv_dtype must be null or 'fp8'")
    return None if value is None else "fp8"


def _stage_spec(raw: Any, what: str) -> StageSpec:
    if not isinstance(raw, dict):
        raise WorkerMessageRejected(f"{what}: a stage must be an object")
    _only(raw, StageSpec, what)
    try:
        return StageSpec(
            _int(raw, "index", what, 0, MAX_RANK), _str(raw, "device", what, limit=200),
            _str(raw, "torch_device", what, limit=200), _int(raw, "start", what, 0, 2**20),
            _int(raw, "end", what, 0, 2**20), _bool(raw, "entry", what), _bool(raw, "exit", what),
            **{n: _int(raw, n, what, 0, MAX_INT, 0) for n in ("budget_bytes", "planned_weights_bytes",
                                                               "planned_state_bytes", "planned_workspace_bytes",
                                                               "planned_reserve_bytes")},
            kv_dtype=_kv_dtype(raw.get("kv_dtype"), what))
    except ValueError as exc:
        raise WorkerMessageRejected(f"{what}: {exc}") from None
