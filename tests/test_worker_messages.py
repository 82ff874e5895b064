"""The control plane's message codec (:class:`MessageSeal` over the :mod:`worker_messages` structs):
every message round-trips exactly; an unsigned, forged, tampered or malformed one is refused with
:class:`WorkerMessageRejected` (property tests over generated messages), and decoding runs the
checks the hand-written validators used to (ranges, shapes, a packed step's layout)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise.errors import WorkerMessageRejected
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.link_probe import LinkFigures, LinkProbe, ProbePair, ProbeReport
from stagewise.runtime.message_seal import MessageSeal
from stagewise.runtime.stage import StageSpec
from stagewise.runtime.tensor_blob import TensorBlob
from stagewise.runtime.worker_messages import (
    Ack,
    Assignment,
    Down,
    Exit,
    Heartbeat,
    JoinReport,
    Move,
    ProbeDone,
    ProbeRequest,
    Publish,
    Regroup,
    Reset,
    Restore,
    Rollback,
    Run,
    SetBlocks,
    Up,
)

SECRET = b"the-secret-of-this-pool-0123456789"
SESSION = "0123456789abcdef" * 2
INCARNATION = "fedcba9876543210" * 2

ranks = st.integers(1, 4096)
rows = st.integers(0, 4096)
counts = st.integers(0, 2**62)
step_ids = st.integers(1, 2**62)
ids = st.integers(0, 2**31 - 1)
incarnations = st.text("0123456789abcdef", min_size=32, max_size=32)
texts = st.text(max_size=40)
seconds = st.floats(0.0, 1e9, allow_nan=False)
members = st.dictionaries(ranks, incarnations, max_size=4)
row_ops = st.one_of(st.builds(Reset, slot=rows), st.builds(SetBlocks, slot=rows, blocks=st.lists(ids, max_size=6)),
                    st.builds(Move, src=rows, dst=rows), st.builds(Restore, slot=rows, entry=ids))
common = dict(seq=counts, members=members, publish=st.lists(step_ids, max_size=3))


@st.composite
def runs(draw: st.DrawFn) -> Run:
    if draw(st.booleans()):  # a packed step: (N, 1) tokens laid out by segments
        lengths = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
        layout = StepLayout(tuple(range(len(lengths))), tuple(draw(st.integers(0, 50)) for _ in lengths),
                            tuple(lengths), logits=(len(lengths) - 1,))
        tokens = [[draw(ids)] for _ in range(layout.tokens)]
        return Run(step_id=draw(step_ids), tokens=tokens, positions=[[p] for p in layout.positions()],
                   layout=layout, ops=draw(st.lists(row_ops, max_size=3)), **{k: draw(v) for k, v in common.items()})
    b, t = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    grid = st.lists(st.lists(ids, min_size=t, max_size=t), min_size=b, max_size=b)
    return Run(step_id=draw(step_ids), tokens=draw(grid), positions=draw(grid), start=draw(st.none() | ids),
               all_logits=draw(st.booleans()), first_row=draw(rows), eager=draw(st.booleans()),
               greedy=draw(st.booleans()), ops=draw(st.lists(row_ops, max_size=3)),
               **{k: draw(v) for k, v in common.items()})


stage_specs = st.builds(lambda i, s, n, e: StageSpec(i, f"cpu:{i}", "cpu", s, s + n, e, not e, 2**30),
                        st.integers(0, 8), st.integers(0, 40), st.integers(0, 4), st.booleans())
assignments = st.builds(
    lambda inc, world, stages, refused: Assignment(
        incarnation=inc, model="/models/m", dtype="bfloat16", batch=4, context=256, stages=tuple(stages), gen=1,
        data_rank=world - 1, data_world=world, backend="gloo", prev_rank=world - 2, next_rank=-1, first_seq=3,
        timeout_s=30.0, refused=refused, kv_blocks=16),
    incarnations, st.integers(1, 8), st.lists(stage_specs, max_size=2), texts)
probe = LinkProbe(3, 2, "gloo", (ProbePair(1, "cpu", 2, "cpu"),), 8192, 4 << 20, 5, 30.0)
tensors = st.builds(lambda shape, seed: TensorBlob.of(torch.randn(shape, generator=torch.Generator().manual_seed(seed))),
                    st.lists(st.integers(0, 5), max_size=3), st.integers(0, 99))
downs = st.one_of(runs(), st.builds(Publish, step_id=counts, **common), st.builds(Rollback, step_id=counts, **common),
                  st.builds(Regroup, gen=counts, **common), st.builds(Exit, **common), assignments,
                  st.builds(ProbeRequest, incarnation=incarnations, probe=st.just(probe)))
ups = st.one_of(
    st.builds(JoinReport, rank=ranks, incarnation=incarnations, pid=st.integers(1, 2**31), host=texts,
              topology=st.just({"devices": [{"id": "cpu:0", "kind": "cpu", "budget_bytes": 2**30}]})),
    st.builds(Ack, seq=counts, rank=ranks, incarnation=incarnations, ok=st.booleans(), error=texts,
              error_type=st.sampled_from(["", "WorkerLost", "RuntimeError"]), aborted=st.booleans(),
              stage_s=st.lists(seconds, max_size=3), handoff_s=seconds, measured_bytes=st.lists(counts, max_size=3),
              pairs=st.lists(st.tuples(st.integers(0, 2**31 - 1).map(float), st.floats(allow_nan=False)), max_size=3),
              hidden=st.none() | tensors, logits=st.none() | tensors),
    st.builds(Heartbeat, rank=ranks, incarnation=incarnations, n=counts),
    st.builds(ProbeDone, incarnation=incarnations, n=counts,
              report=st.just(ProbeReport(1, True, figures=(LinkFigures(1, 2, 8192, 1e-4, 4 << 20, 1e-3),)))))
messages = st.one_of(downs.map(lambda m: (m, Down)), ups.map(lambda m: (m, Up)))


def _seal(kind: Any, secret: bytes = SECRET, session: str = SESSION) -> MessageSeal[Any]:
    return MessageSeal(secret, session, kind, "test", log=lambda _: None)


@settings(max_examples=150, deadline=None)
@given(messages)
def test_every_message_round_trips(pair: tuple[msgspec.Struct, Any]) -> None:
    message, kind = pair
    assert _seal(kind).open(_seal(kind).seal(message)) == message


@settings(max_examples=150, deadline=None)
@given(messages, st.data())
def test_a_changed_byte_anywhere_is_refused(pair: tuple[msgspec.Struct, Any], data: st.DataObject) -> None:
    message, kind = pair
    blob = bytearray(_seal(kind).seal(message))
    at = data.draw(st.integers(0, len(blob) - 1))
    blob[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(WorkerMessageRejected, match=r"unsigned|bad signature"):
        _seal(kind).open(bytes(blob))


@settings(max_examples=100, deadline=None)
@given(messages)
def test_unsigned_forged_or_foreign_session_messages_are_refused(pair: tuple[msgspec.Struct, Any]) -> None:
    message, kind = pair
    with pytest.raises(WorkerMessageRejected, match="unsigned"):
        _seal(kind).open(msgspec.msgpack.encode(message))
    with pytest.raises(WorkerMessageRejected, match="bad signature"):
        _seal(kind).open(_seal(kind, secret=b"a guessed secret, but not the one").seal(message))
    with pytest.raises(WorkerMessageRejected, match="bad signature"):
        _seal(kind).open(_seal(kind, session="f" * 32).seal(message))  # an earlier pool's message


def _signed(seal: MessageSeal[Any], raw: dict[str, Any]) -> bytes:
    """``raw`` encoded and signed with the pool's secret: a genuine signature over whatever it holds."""
    body = msgspec.msgpack.encode(raw)
    return b"SWZ1" + seal._mac(body) + body


@settings(max_examples=150, deadline=None)
@given(messages, st.data())
def test_a_signed_but_malformed_message_is_refused(pair: tuple[msgspec.Struct, Any], data: st.DataObject) -> None:
    message, kind = pair
    raw = msgspec.to_builtins(message)
    fields = sorted(k for k in raw if k not in ("op", "topology"))
    change = data.draw(st.sampled_from(["wrong type", "unknown field", "unknown op"] if fields else ["unknown op"]))
    if change == "wrong type":
        raw[data.draw(st.sampled_from(fields))] = [None]  # no field holds a list of nulls
    elif change == "unknown field":
        raw["format_disk"] = True
    else:
        raw["op"] = "format-disk"
    with pytest.raises(WorkerMessageRejected, match="malformed"):
        _seal(kind).open(_signed(_seal(kind), raw))


def _run(**change: Any) -> bytes:
    raw = msgspec.to_builtins(Run(seq=7, members={1: INCARNATION}, step_id=1, tokens=[[5]], positions=[[0]]))
    return _signed(_seal(Down), raw | change)


@pytest.mark.parametrize("change", [
    {"tokens": [[-1]]}, {"tokens": [[1, 2]]}, {"positions": [["0"]]}, {"tokens": []}, {"members": {"0": INCARNATION}},
    {"members": {"1": "../../etc"}}, {"first_row": True}, {"start": -5}, {"first_row": -1}, {"first_row": 5000},
    {"publish": [0]}, {"publish": ["3"]}, {"publish": 3}, {"publish": list(range(1, 5000))}, {"eager": "yes"},
    {"greedy": 1}, {"ops": [{"op": "set_blocks", "slot": 0, "blocks": [-1]}]}, {"ops": [{"op": "move", "src": "1", "dst": 0}]},
    {"ops": [{"op": "exit", "seq": 1, "members": {}}]}, {"ops": [{"op": "reset", "slot": 0, "length": 3}]},
    {"layout": {"rows": [0, 0], "starts": [0, 0], "lengths": [1, 1]}, "tokens": [[1], [2]], "positions": [[0], [0]]},
    {"layout": {"rows": [0], "starts": [0], "lengths": [3]}},  # 3 tokens laid out, 1 sent
    {"tokens_of": 1}, {"tokens": None}, {"tokens": None, "tokens_of": 0},  # both, neither, no step 0
    {"tokens": None, "tokens_of": 3, "step_id": 2}, {"tokens": None, "tokens_of": 2, "step_id": 2},  # not earlier
    {"tokens": None, "tokens_of": 1, "step_id": 2, "positions": [[0, 1]]},  # a kept step's tokens are one a row
])
def test_malformed_runs_are_refused(change: dict[str, Any]) -> None:
    assert isinstance(_seal(Down).open(_run()), Run)
    reads = _seal(Down).open(_run(tokens=None, tokens_of=1, step_id=2))  # the tokens step 1 left in the worker
    assert isinstance(reads, Run) and reads.tokens is None and reads.tokens_of == 1
    with pytest.raises(WorkerMessageRejected, match="malformed"):
        _seal(Down).open(_run(**change))


def test_acks_assignments_and_tensors_are_checked() -> None:
    up = _seal(Up)

    def signed(raw: dict[str, Any]) -> bytes:
        return _signed(up, raw)

    ack = msgspec.to_builtins(Ack(seq=3, rank=1, incarnation=INCARNATION, ok=True))
    for bad in ({"ok": "yes"}, {"stage_s": [float("nan")]}, {"pairs": [[1.5, 0.0]]}, {"pairs": [[-1.0, 0.0]]},
                {"pairs": [[3.0]]}, {"error_type": "os.system('x')"}, {"rank": 0}):
        with pytest.raises(WorkerMessageRejected, match="malformed"):
            up.open(signed(ack | bad))
    blob = TensorBlob.of(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(blob.tensor(), torch.arange(6, dtype=torch.float32).reshape(2, 3))
    with pytest.raises(WorkerMessageRejected, match="bytes for shape"):
        up.open(signed(ack | {"hidden": msgspec.to_builtins(blob) | {"data": blob.data[:-4]}}))
    with pytest.raises(WorkerMessageRejected, match="malformed"):
        up.open(signed(ack | {"hidden": {"shape": [-1], "dtype": "float32", "data": b""}}))
    logits = torch.randn(40, 128_256, dtype=torch.bfloat16)  # 10.3 MB: more than a TCPStore message held
    big = up.open(up.seal(Ack(seq=3, rank=1, incarnation=INCARNATION, ok=True, logits=TensorBlob.of(logits))))
    assert isinstance(big, Ack) and big.logits is not None and torch.equal(big.logits.tensor(), logits)
    down = _seal(Down)
    good = Assignment(incarnation=INCARNATION, model="m", dtype="float32", batch=1, context=8, stages=(), gen=0,
                      data_rank=0, data_world=2, backend="gloo", prev_rank=-1, next_rank=1, first_seq=1, timeout_s=5.0)
    assert down.open(down.seal(good)) == good
    for change in ({"dtype": "int8"}, {"data_rank": 2}, {"next_rank": 7}, {"backend": "mpi"}, {"timeout_s": -1},
                   {"stages": [{"index": 0, "device": "cpu:0", "torch_device": "cpu", "start": 3, "end": 1,
                                "entry": True, "exit": True, "budget_bytes": 1}]}):
        with pytest.raises(WorkerMessageRejected, match="malformed"):
            down.open(_signed(down, msgspec.to_builtins(good) | change))
