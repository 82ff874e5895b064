"""The engine on a real (tiny, random) model: outputs, stop strings, failures, cancellation, draining."""

from __future__ import annotations

import gc
import logging
import queue
import time
from collections.abc import Iterator

import pytest

from stagewise.engine.engine import Engine
from stagewise.engine.generator import Generator
from stagewise.engine.heap_freeze import freeze_heap
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.engine.request import EngineRequest
from stagewise.engine.request_output import RequestOutput
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.scheduler import QueueFull
from stagewise.errors import StepFailed
from tests.test_server_support import make_model_dir

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module", params=["single", "pipeline:2"])
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    path = make_model_dir(tmp_path_factory.mktemp("engine-model"))
    devices = "cpu:2x2GiB" if request.param != "single" else None
    model = load_model(str(path), devices, request.param, 256, max_seqs=4, prefill_chunk=8)
    yield model
    model.close()


@pytest.fixture
def engine(loaded: LoadedModel) -> Iterator[Engine]:
    engine = Engine(loaded, max_waiting=2).start()
    yield engine
    engine.stop()


def _request(engine: Engine, prompt: str = "Hello, world! How are you today?", **kw: object) -> EngineRequest:
    ids = tuple(engine.tokenizer.encode(prompt))
    fields: dict[str, object] = {"max_tokens": 24, "sampling": GREEDY, "stop_token_ids": engine.stop_token_ids} | kw
    return EngineRequest("test", ids, **fields)  # type: ignore[arg-type]


def _run(engine: Engine, request: EngineRequest) -> list[RequestOutput]:
    outputs: queue.Queue[RequestOutput] = queue.Queue()
    handle = engine.submit(request, outputs.put)
    assert handle.wait(30)
    items = []
    while not outputs.empty():
        items.append(outputs.get())
    assert items[-1].finished
    return items


def _text(outputs: list[RequestOutput]) -> str:
    return "".join(o.text for o in outputs)


def _alone(engine: Engine) -> Generator:
    """The single-sequence path over the engine's pipeline (while the engine is idle)."""
    return Generator(engine.model.pipeline, engine.model.max_context, prefill_chunk=8)


def test_text_matches_the_generator(engine: Engine) -> None:
    request = _request(engine)
    tokens = [e.sample.token for e in _alone(engine).stream(request.generation())]
    outputs = _run(engine, request)
    kept = [t for t in tokens if t not in engine.stop_token_ids]
    assert _text(outputs) == engine.tokenizer.decode(kept)
    assert outputs[-1].completion_tokens == len(tokens)
    assert outputs[-1].prompt_tokens == len(request.prompt_ids)
    assert outputs[-1].finish_reason == ("stop" if tokens[-1] in engine.stop_token_ids else "length")


def test_warm_up_leaves_no_trace(loaded: LoadedModel) -> None:
    """The warm-up's synthetic requests run through the batcher and leave nothing behind: a request
    after it gives the tokens a fresh engine gives. Only GPU pipelines are warmed."""
    from stagewise.engine.warm_up import needs_warm_up

    assert not needs_warm_up(loaded)  # CPU stages: nothing to compile or capture
    fresh = Engine(loaded, max_waiting=2)
    request = _request(fresh)
    want = [e.sample.token for e in _alone(fresh).stream(request.generation())]
    warmed = Engine(loaded, max_waiting=2)
    done = warmed.warm_up()
    assert done.prompt_tokens[:8] == (8, 17, 8, 9, 10, 11, 8, 8)  # ..., one sampled on the host beside a greedy one
    assert set(done.prompt_tokens[8:]) == {1, *done.packed_tokens}
    assert done.generated_tokens >= 8 * 4 and done.seconds > 0
    assert done.decode_shapes == done.launchable_shapes and not done.missing_shapes
    assert done.graph_keys == {(first, run, 256) for first, run in done.launchable_shapes}  # one bucket: the context
    assert [e.sample.token for e in _alone(warmed).stream(request.generation())] == want
    started = warmed.start()
    try:
        with pytest.raises(RuntimeError):
            started.warm_up()  # only before the worker runs
    finally:
        started.stop()
    gpu = LoadedModel(**{**loaded.__dict__, "placement_json": {"stages": [{"device": "cpu:0"}, {"device": "cuda:1"}]}})
    assert needs_warm_up(gpu)


def test_metrics_count_the_steps_of_a_delivered_token(loaded: LoadedModel) -> None:
    """A consumer that holds a token reads metrics which include the step that made it: the steps
    counted when the last token arrives are all the request's steps (none observed after it)."""
    def steps() -> float:
        value = engine.metrics.registry.get_sample_value(
            "stagewise_stage_step_seconds_count", {"stage": "0", "device": loaded.pipeline.stages[0].spec.device})
        return value or 0.0

    seen: list[tuple[bool, float]] = []
    timing, loaded.pipeline.timing = loaded.pipeline.timing, True
    engine = Engine(loaded, max_waiting=2)
    try:
        handle = engine.submit(_request(engine, max_tokens=6), lambda out: seen.append((out.finished, steps())))
        while not handle.done:
            engine.turn(0.0)
        engine.turn(0.0)  # idle: collects whatever is still in flight
    finally:
        loaded.pipeline.timing = timing
    assert seen[-1][0] and seen[-1][1] >= 6
    assert seen[-1][1] == steps()


def test_stop_string_cuts_the_output(engine: Engine) -> None:
    full = _text(_run(engine, _request(engine)))
    assert len(full) >= 8
    stop = full[5:8]
    cut = _run(engine, _request(engine, stop=(stop,)))
    assert _text(cut) == full[: full.index(stop)]
    assert cut[-1].finish_reason == "stop"


def test_failed_step_fails_only_its_request(engine: Engine) -> None:
    expected = _text(_run(engine, _request(engine)))
    engine.guard.fail_next_step(len(engine.model.pipeline.stages) - 1)
    failed = _run(engine, _request(engine))
    assert failed[-1].finish_reason == "error"
    assert isinstance(failed[-1].error, StepFailed)
    assert _text(_run(engine, _request(engine))) == expected  # rolled back: nothing leaked


HANG_S = 120.0  # a wait on the engine's state that takes this long is a hang, never a race


def _wait_until(done: object, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.005)


def test_cancel_during_prefill_frees_the_slot(engine: Engine) -> None:
    engine.guard.delay_s = 0.2  # each 8-token prefill chunk: the prompt's dozen chunks take seconds
    long_prompt = "Pipelines split a model into stages; each stage owns one device. " * 4
    outputs: queue.Queue[RequestOutput] = queue.Queue()
    handle = engine.submit(_request(engine, long_prompt), outputs.put)
    _wait_until(lambda: engine.scheduler.running == 1, "admission")  # the prefill under way
    handle.cancel()
    assert handle.wait(HANG_S)
    last = outputs.get()
    assert last.finish_reason == "cancelled" and last.completion_tokens == 0
    _wait_until(lambda: engine.scheduler.running == 0, "freeing the slot")
    assert engine.metrics.state_slots_in_use._value.get() == 0


def test_queue_full_then_drain_cancels_after_grace(engine: Engine) -> None:
    engine.guard.delay_s = 0.05
    sink: queue.Queue[RequestOutput] = queue.Queue()
    slots = engine.batcher.slots
    running = [engine.submit(_request(engine, max_tokens=200), sink.put) for _ in range(slots)]  # a free slot each
    _wait_until(lambda: engine.scheduler.running == slots, "admission")
    waiting = [engine.submit(_request(engine), sink.put) for _ in range(2)]  # max_waiting=2 beyond the slots
    with pytest.raises(QueueFull):
        engine.submit(_request(engine), sink.put)
    assert engine.drain(grace_s=0.2) is False
    for handle in (*running, *waiting):
        assert handle.done


def test_drain_lets_requests_finish(engine: Engine) -> None:
    sink: queue.Queue[RequestOutput] = queue.Queue()
    handle = engine.submit(_request(engine, max_tokens=8), sink.put)
    assert engine.drain(grace_s=10) is True
    finals = [o for o in list(sink.queue) if o.finished]
    assert handle.done and finals[0].finish_reason in ("stop", "length")


def test_second_drain_cancels_at_once(engine: Engine) -> None:
    engine.guard.delay_s = 0.05  # 200 tokens: 10 s at least, far past this test
    sink: queue.Queue[RequestOutput] = queue.Queue()
    handle = engine.submit(_request(engine, max_tokens=200), sink.put)
    engine.begin_drain(grace_s=60)
    assert engine.drain(grace_s=60) is False  # the second: what runs is cancelled at the next turn
    assert handle.done and list(sink.queue)[-1].finish_reason == "cancelled"


def test_drain_without_a_worker_takes_the_turns(loaded: LoadedModel) -> None:
    engine = Engine(loaded, max_waiting=2)  # never started: the draining thread runs the request
    sink: queue.Queue[RequestOutput] = queue.Queue()
    handle = engine.submit(_request(engine, max_tokens=8), sink.put)
    assert engine.drain(grace_s=30) is True
    assert handle.done and list(sink.queue)[-1].finish_reason in ("stop", "length")


def test_one_info_line_per_request(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stagewise.requests")
    request = _request(engine, max_tokens=5)
    outputs = _run(engine, request)
    lines = [r.getMessage() for r in caplog.records if r.name == "stagewise.requests"]
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith(f"request {request.request_id}: prompt {len(request.prompt_ids)} tokens, "
                           f"completion {outputs[-1].completion_tokens} tokens, TTFT ")
    assert "tok/s" in line and line.endswith(f"finish {outputs[-1].finish_reason}")


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-buckets"])
def test_warm_up_launches_every_decode_shape_the_batcher_can(loaded: LoadedModel, graphs: bool) -> None:
    """The decode step shapes (first row, rows run) warm-up launched are exactly those the batcher can
    launch (with no prompt prefilled beside them); with graphs, batch buckets padded with free rows."""
    from stagewise.engine.decode_groups import plan_groups

    engine = Engine(loaded, max_waiting=2)
    engine.batcher.graphs = graphs  # the CPU pipeline captures nothing; the bucketing is the batcher's
    done = engine.warm_up()
    slots, groups = engine.batcher.slots, engine.batcher.micro_batches
    want = {(first, run) for count in range(1, slots + 1)
            for first, _, run in plan_groups(count, groups, graphs, slots - 1 if count < slots else slots)}
    assert done.launchable_shapes == want
    assert done.decode_shapes == want and not done.missing_shapes
    assert f"({len(want)} shapes of {len(want)} launchable)" in done.summary()



def test_freeze_heap_leaves_what_is_loaded_out_of_full_collections(loaded: LoadedModel) -> None:
    gc.unfreeze()  # whatever an earlier test froze
    try:
        freeze_heap()  # as the server's processes do once loaded
        assert gc.get_freeze_count() > 10_000  # the model and the imports: not walked by later collections
    finally:
        gc.unfreeze()  # this test process loads many models: let them be collected
