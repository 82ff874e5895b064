"""Stop-string matching across chunk boundaries, and the scheduler's FIFO admission."""

from __future__ import annotations

import pytest

from stagewise.engine.request import EngineRequest
from stagewise.engine.request_handle import RequestHandle
from stagewise.engine.scheduler import EngineClosed, QueueFull, Scheduler
from stagewise.engine.stop_strings import StopMatcher
from stagewise.errors import RequestError


def _feed(stops: tuple[str, ...], chunks: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out = []
    for chunk in chunks:
        text, stopped = matcher.push(chunk)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


@pytest.mark.parametrize(
    ("stops", "chunks", "expected"),
    [
        (("END",), ["hello E", "N", "D and more"], ("hello ", True)),
        (("END",), ["hello EN", "d"], ("hello ENd", False)),
        (("\n\n", "###"), ["a\n", "\nb"], ("a", True)),
        (("ab", "b"), ["xa", "b"], ("x", True)),
        ((), ["any", " text"], ("any text", False)),
        (("stop",), ["sto"], ("sto", False)),
        (("é!",), ["caf", "é", "!", "x"], ("caf", True)),
    ],
)
def test_stop_matcher(stops: tuple[str, ...], chunks: list[str], expected: tuple[str, bool]) -> None:
    assert _feed(stops, chunks) == expected


def test_stop_matcher_holds_back_only_possible_prefixes() -> None:
    matcher = StopMatcher(("<end>",))
    assert matcher.push("abc<en") == ("abc", False)
    assert matcher.push("x") == ("<enx", False)
    assert matcher.matched is None


def test_the_stop_string_that_matched_first_in_the_text_is_named() -> None:
    matcher = StopMatcher(("END", "\n\n", "B"))
    assert matcher.push("aa\n") == ("aa", False)
    assert matcher.push("\nEND B") == ("", True) and matcher.matched == "\n\n"


def _handle(n: int) -> RequestHandle:
    return RequestHandle(EngineRequest(f"r{n}", (1, 2, 3), 4), lambda _: None)


def test_scheduler_is_fifo_and_bounded() -> None:
    scheduler = Scheduler(max_waiting=2)
    a, b, c = _handle(0), _handle(1), _handle(2)
    for handle in (a, b, c):  # a: the free slot takes it; b and c wait for a slot (--queue 2)
        scheduler.add(handle)
    with pytest.raises(QueueFull):
        scheduler.add(_handle(3))
    batch = scheduler.schedule(0.0)
    assert batch.run == (a,)
    assert scheduler.schedule(0.0).run == ()  # one running at a time
    with pytest.raises(QueueFull):
        scheduler.add(_handle(3))  # a runs, b and c wait: still full
    scheduler.update(batch)
    assert scheduler.schedule(0.0).run == (b,)


def test_scheduler_bounds_only_what_waits_beyond_the_free_slots() -> None:
    scheduler = Scheduler(max_waiting=1, max_running=4)
    handles = [_handle(i) for i in range(5)]  # the engine worker is busy: nothing moves to running meanwhile
    for handle in handles:
        scheduler.add(handle)
    assert scheduler.waiting == 5 and scheduler.beyond_slots == 1
    with pytest.raises(QueueFull):
        scheduler.add(_handle(5))
    assert scheduler.schedule(0.0).run == tuple(handles[:4])
    assert scheduler.beyond_slots == 1  # the fifth still waits for a slot


def test_scheduler_drops_cancelled_and_refuses_after_close() -> None:
    scheduler = Scheduler(max_waiting=4)
    a, b = _handle(0), _handle(1)
    scheduler.add(a)
    scheduler.add(b)
    a.cancel()
    assert scheduler.waiting == 1  # it left the queue at once, before the worker's next schedule()
    batch = scheduler.schedule(0.0)
    assert batch.dropped == (a,) and batch.run == (b,)
    b.cancel()  # running: the batcher notices it; the queue is not touched
    assert scheduler.running == 1 and scheduler.waiting == 0
    scheduler.close()
    with pytest.raises(EngineClosed):
        scheduler.add(_handle(2))


def test_cancelled_waiting_request_frees_its_place_at_once() -> None:
    scheduler = Scheduler(max_waiting=1)
    a, b = _handle(0), _handle(1)
    scheduler.add(a)
    scheduler.add(b)
    with pytest.raises(QueueFull):
        scheduler.add(_handle(2))
    b.cancel()
    scheduler.add(_handle(3))  # b's place is free without any schedule() in between


def test_engine_request_validates() -> None:
    with pytest.raises(RequestError):
        EngineRequest("r", (), 4)
    with pytest.raises(RequestError):
        EngineRequest("r", (1,), 4, stop=("a", "b", "c", "d", "e"))
    with pytest.raises(RequestError):
        EngineRequest("r", (1,), 0)


def test_sampler_refuses_non_finite_logits() -> None:
    import pytest
    import torch

    from stagewise.engine.sampling import Sampler, SamplingParams
    from stagewise.errors import StepFailed

    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, seed=1)):
        with pytest.raises(StepFailed, match="non-finite"):
            Sampler(params).sample(torch.full((16,), float("nan")))
