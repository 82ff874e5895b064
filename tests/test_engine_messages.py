"""The engine-process messages: every kind round-trips through the codec; anything malformed is refused with
:class:`EngineMessageRejected` and nothing of it is applied."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise.engine.request_output import RequestOutput
from stagewise.engine.scheduler import QueueFull
from stagewise.errors import ContextLengthExceeded, EngineMessageRejected, StepFailed
from stagewise.server import engine_messages as m
from stagewise.server.engine_core import EngineCore
from stagewise.server.message_codec import error_of, error_record, from_engine_codec, to_engine_codec
from stagewise.server.message_records import output_of, output_record
from stagewise.server.openai_errors import InvalidParam

text = st.text(max_size=20)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
floats = st.floats(allow_nan=False)
maybe_int = st.none() | ints
token_ids = st.lists(st.integers(0, 2**31), max_size=8).map(tuple)
errors = st.builds(m.ErrorRecord, st.sampled_from(["QueueFull", "StepFailed", "InvalidParam", "EngineDied"]), text,
                   st.none() | text, st.none() | text)
grammars = st.none() | st.builds(m.GrammarRecord, text, text)
sampling = st.builds(m.SamplingRecord, floats, floats, ints, floats, floats, floats, maybe_int,
                     st.lists(st.tuples(ints, floats), max_size=3).map(tuple), grammars)
logprobs = st.builds(m.LogprobRecord, text, floats, token_ids,
                     st.lists(st.tuples(text, floats, token_ids), max_size=2).map(tuple))
outputs = st.builds(m.OutputRecord, ints, text, ints, ints, st.lists(logprobs, max_size=2).map(tuple),
                    st.none() | text, st.none() | errors, ints)
tokenizers = st.builds(m.TokenizerRecord, text, maybe_int, maybe_int, token_ids, maybe_int, maybe_int, st.none() | text)
models = st.builds(m.ModelRecord, text, ints, ints, token_ids, tokenizers, text, ints, ints, text)
samples = st.builds(m.SampleRecord, text, st.dictionaries(text, text, max_size=2), floats)
families = st.builds(m.FamilyRecord, text, text, text, st.lists(samples, max_size=3).map(tuple))

TO_ENGINE = st.one_of(
    st.builds(m.Submit, ints, text, token_ids, ints, sampling, st.lists(text, max_size=4).map(tuple), token_ids,
              st.booleans(), ints),
    st.builds(m.Cancel, ints), st.builds(m.MetricsQuery, ints), st.builds(m.FailNextStep, ints),
    st.builds(m.StepDelay, floats), st.builds(m.Drain, floats), st.just(m.Exit()),
)
FROM_ENGINE = st.one_of(
    st.builds(m.Phase, text), st.builds(m.Ready, models, ints), st.builds(m.LoadFailed, errors),
    st.builds(m.Admitted, ints, st.none() | errors), st.builds(m.StepOutputs, st.lists(outputs, max_size=3).map(tuple)),
    st.builds(m.MetricsReply, ints, st.lists(families, max_size=2).map(tuple)), st.builds(m.Health, st.none() | text),
    st.builds(m.Drained, st.booleans()), st.just(m.Alive()),
)


def test_every_kind_is_covered() -> None:
    kinds = {t.__name__ for t in (*m.ToEngine.__args__, *m.FromEngine.__args__)}  # type: ignore[attr-defined]
    assert kinds == {"Submit", "Cancel", "MetricsQuery", "FailNextStep", "StepDelay", "Drain", "Exit", "Phase", "Ready",
                     "LoadFailed", "Admitted", "StepOutputs", "MetricsReply", "Health", "Drained", "Alive"}


@settings(max_examples=300, deadline=None)
@given(TO_ENGINE)
def test_messages_to_the_engine_round_trip(message: m.ToEngine) -> None:
    codec = to_engine_codec()
    assert codec.decode(codec.encode(message)) == message


@settings(max_examples=300, deadline=None)
@given(FROM_ENGINE)
def test_messages_from_the_engine_round_trip(message: m.FromEngine) -> None:
    codec = from_engine_codec()
    assert codec.decode(codec.encode(message)) == message


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_are_refused(data: bytes) -> None:
    for codec in (to_engine_codec(), from_engine_codec()):
        try:
            decoded = codec.decode(data)
        except EngineMessageRejected:
            continue
        assert isinstance(decoded, (*m.ToEngine.__args__, *m.FromEngine.__args__))  # type: ignore[attr-defined]


@pytest.mark.parametrize("body", [
    {"kind": "submit", "key": 1},  # fields missing
    {"kind": "cancel", "key": "1"},  # a field of the wrong type
    {"kind": "launch", "key": 1},  # no such kind
    {"kind": "ready", "model": None, "pid": 1},  # a kind the engine never receives
    [1, 2, 3],
])
def test_malformed_messages_are_refused(body: Any) -> None:
    with pytest.raises(EngineMessageRejected, match="malformed engine message"):
        to_engine_codec().decode(msgspec.msgpack.encode(body))


def test_errors_cross_with_their_type_status_and_param() -> None:
    for error in (QueueFull("full"), StepFailed("boom"), InvalidParam("too long", "messages", ContextLengthExceeded.code)):
        back = error_of(error_record(error))
        assert type(back) is type(error) and str(back) == str(error) and back.http_status == error.http_status
        assert back.code == error.code and getattr(back, "param", None) == getattr(error, "param", None)
    with pytest.raises(EngineMessageRejected, match="unknown error class 'Exploded'"):
        error_of(m.ErrorRecord("Exploded", "?"))


def test_outputs_round_trip_and_an_inconsistent_one_is_refused() -> None:
    output = RequestOutput("hi", 3, 2, finish_reason="error", error=StepFailed("boom"), cached_tokens=1)
    back = output_of(output_record(7, output))
    assert (back.text, back.prompt_tokens, back.completion_tokens, back.finish_reason, back.cached_tokens) == (
        "hi", 3, 2, "error", 1) and isinstance(back.error, StepFailed)
    stopped = output_of(output_record(8, RequestOutput("x", 3, 2, finish_reason="stop", stop_string="END")))
    assert stopped.stop_string == "END"
    with pytest.raises(EngineMessageRejected, match="inconsistent"):
        output_of(m.OutputRecord(7, "", 1, 1, (), "length", None, 0, "END"))  # a stop string without a stop
    with pytest.raises(EngineMessageRejected, match="inconsistent"):
        output_of(m.OutputRecord(7, "", 1, 1, (), "exploded", None, 0))
    with pytest.raises(EngineMessageRejected, match="inconsistent"):
        output_of(m.OutputRecord(7, "", 1, 1, (), "error", None, 0))  # an error finish without its error


class _Recorder:
    """Stands for the engine and the sockets: records every call; the core must make none for bad input."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> None:
            self.calls.append(name)
        return record


def test_the_engine_core_applies_nothing_of_a_malformed_message(capsys: pytest.CaptureFixture[str]) -> None:
    core = EngineCore.__new__(EngineCore)  # only apply() is exercised: no model, no sockets
    engine, outbox = _Recorder(), _Recorder()
    core.engine, core.outbox, core.codec, core.handles = engine, outbox, to_engine_codec(), {}  # type: ignore[assignment]
    for data in (b"\x00garbage", msgspec.msgpack.encode({"kind": "submit", "key": 1, "request_id": 5}),
                 msgspec.msgpack.encode({"kind": "drain", "grace_s": "soon"})):
        core.apply(data)
    assert engine.calls == [] and outbox.calls == [] and core.handles == {}
    assert capsys.readouterr().err.count("malformed engine message") == 3


def test_the_api_side_delivers_nothing_of_a_step_with_one_bad_output() -> None:
    from stagewise.engine.request import EngineRequest
    from stagewise.server.engine_process import EngineProcess
    from stagewise.server.remote_handle import RemoteHandle
    from stagewise.server.serve_settings import ServeSettings

    front = EngineProcess(ServeSettings())  # sockets only: no engine process is started
    try:
        got: list[RequestOutput] = []
        front._handles[0] = RemoteHandle(0, EngineRequest("r", (1, 2), 4), got.append, lambda key: None)
        good = output_record(0, RequestOutput("a", 2, 1))
        bad = m.OutputRecord(0, "", 2, 2, (), "exploded", None, 0)
        with pytest.raises(EngineMessageRejected):
            front._apply(m.StepOutputs((good, bad)))
        assert got == []  # the good output of the rejected message was not delivered either
        front._apply(m.StepOutputs((good,)))
        assert [o.text for o in got] == ["a"]
    finally:
        front.stop()
