"""A client that hangs up is seen on its socket by the thread that delivers the engine's outputs, and its
request is cancelled there at once, without waiting for the event loop to notice the disconnect."""

from __future__ import annotations

import asyncio
import socket

from stagewise.engine.engine import Engine
from stagewise.engine.model_loading import load_model
from stagewise.engine.request import EngineRequest
from stagewise.engine.request_output import RequestOutput
from stagewise.server import engine_messages as m
from stagewise.server.choices import Choices
from stagewise.server.client_socket import client_fd, client_transport, hung_up, remember_client
from stagewise.server.engine_front import LocalEngine
from stagewise.server.engine_process import EngineProcess
from stagewise.server.message_records import output_record
from stagewise.server.output_stream import ClientGone
from stagewise.server.random_tokenizer import with_demo_tokenizer
from stagewise.server.remote_handle import RemoteHandle
from stagewise.server.serve_settings import ServeSettings


def test_hung_up_reports_closed_and_reset_peers_only() -> None:
    open_a, open_b = socket.socketpair()
    left_a, left_b = socket.socketpair()
    reset_a, reset_b = socket.socketpair()
    try:
        left_b.close()
        reset_b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        reset_b.close()
        open_b.sendall(b"more bytes")  # data to read is not a hang-up
        assert hung_up([open_a.fileno(), left_a.fileno(), reset_a.fileno()]) == {left_a.fileno(), reset_a.fileno()}
        assert hung_up([]) == set()
        gone = open_a.fileno()
        open_a.close()
        assert gone in hung_up([gone])  # a descriptor closed here (its connection ended) counts too
    finally:
        for sock in (open_b, left_a, reset_a):
            sock.close()


def test_the_scope_carries_the_connection() -> None:
    scope: dict[str, object] = {"type": "http"}
    assert client_transport(scope) is None and client_fd(None) is None  # a test client's scope: nothing to ask

    async def record() -> None:
        ours, theirs = socket.socketpair()
        transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, sock=ours)
        remember_client(scope, transport)
        assert client_transport(scope) is transport and client_fd(transport) == ours.fileno()
        transport.close()
        await asyncio.sleep(0)  # the transport closes its socket on the next iteration
        assert client_fd(transport) is None
        theirs.close()
    asyncio.run(record())


def test_the_receiver_cancels_a_request_whose_client_hung_up() -> None:
    front = EngineProcess(ServeSettings())  # sockets only: no engine process is started
    ours, theirs = socket.socketpair()
    cancels: list[int] = []
    try:
        got: list[RequestOutput] = []
        handle = RemoteHandle(0, EngineRequest("r", (1, 2), 8), got.append, cancels.append, ours.fileno())
        other = RemoteHandle(1, EngineRequest("s", (1, 2), 8), got.append, cancels.append, None)
        front._handles.update({0: handle, 1: other})
        step = m.StepOutputs((output_record(0, RequestOutput("a", 2, 1)), output_record(1, RequestOutput("b", 2, 1))))
        front._apply(step)
        assert cancels == []  # the client is still there
        theirs.close()
        front._apply(step)
        assert cancels == [0]  # cancelled by the step that found it gone; the request without a socket runs on
        front._apply(step)
        handle.cancel()  # the event loop's watcher noticing later asks nothing more
        assert cancels == [0] and len(got) == 6
    finally:
        ours.close()
        front.stop()


def test_an_in_process_engine_cancels_at_the_output_after_the_hang_up() -> None:
    loaded = with_demo_tokenizer(load_model("random:tiny-llama", None, "single", 128))
    engine = Engine(loaded, max_waiting=4).start()
    ours, theirs = socket.socketpair()
    theirs.close()  # the client left before its first token
    try:
        outputs: list[RequestOutput] = []
        ended = asyncio.Event()

        async def run() -> None:
            loop = asyncio.get_running_loop()

            def sink(output: RequestOutput) -> None:  # the engine's thread
                outputs.append(output)
                if output.finished:
                    loop.call_soon_threadsafe(ended.set)
            request = EngineRequest("r", (1, 2, 3), 64, logprobs=True)  # every token is an output
            await LocalEngine(loaded, engine).submit(request, sink, ours.fileno())
            await ended.wait()
        asyncio.run(run())
        assert outputs[-1].finish_reason == "cancelled"
        assert outputs[-1].completion_tokens < 64  # stopped long before max_tokens
    finally:
        engine.stop()
        ours.close()
        loaded.close()


def test_a_stream_writes_nothing_more_once_its_connection_is_closing() -> None:
    class Connection(asyncio.BaseTransport):
        closing = False

        def is_closing(self) -> bool:
            return self.closing

    async def read() -> list[str]:
        client = Connection()
        choices = Choices(client)
        choices.handles.append(RemoteHandle(0, EngineRequest("r", (1, 2), 8), lambda output: None, lambda key: None))
        seen = []
        for text in ("a", "b"):
            choices.queue.put_nowait((0, RequestOutput(text, 2, 1)))
        seen.append((await choices.get())[1].text)
        client.closing = True  # a send failed: the transport closed itself, the response not told yet
        try:
            await choices.get()
        except ClientGone:
            seen.append("gone")
        return seen
    assert asyncio.run(read()) == ["a", "gone"]  # "b" was queued, and is not written
