"""StepTurns: the event loop's ready I/O waits for the engine's step under way, never past the bound."""

from __future__ import annotations

import asyncio
import socket
import threading

from stagewise.server.step_turns import StepTurns, TurnTakingSelector


def test_the_loop_returns_at_once_while_no_step_runs() -> None:
    turns = StepTurns(max_wait_s=3600)
    turns.after_step()  # no step: no wait (an hour-long bound would hang the test)


def test_ready_io_is_handled_after_the_step_under_way() -> None:
    turns = StepTurns(max_wait_s=3600)
    in_step, step_may_end, handled = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []

    def engine() -> None:
        with turns.step():
            in_step.set()
            step_may_end.wait()
            order.append("step ended")

    def loop() -> None:
        turns.after_step()
        order.append("loop ran")
        handled.set()

    worker = threading.Thread(target=engine)
    worker.start()
    in_step.wait()
    waiter = threading.Thread(target=loop)
    waiter.start()
    assert not handled.wait(0.05)  # held while the step runs (a wait that may only fail to be short)
    step_may_end.set()
    worker.join()
    waiter.join()
    assert order == ["step ended", "loop ran"]


def test_a_step_longer_than_the_bound_does_not_hold_the_loop() -> None:
    turns = StepTurns(max_wait_s=0.0)
    step_may_end = threading.Event()
    with turns.step():
        turns.after_step()  # returns though the step has not ended: the bound (0 s) is over
        step_may_end.set()


def test_an_event_loop_on_the_selector_serves_sockets() -> None:
    turns = StepTurns()
    loop = asyncio.SelectorEventLoop(TurnTakingSelector(turns))
    a, b = socket.socketpair()
    try:
        async def echo() -> bytes:
            reader, writer = await asyncio.open_connection(sock=a)
            b.sendall(b"ping")
            data = await reader.readexactly(4)
            writer.close()
            return data
        assert loop.run_until_complete(echo()) == b"ping"
    finally:
        loop.close()
        b.close()
