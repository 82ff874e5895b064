"""``POST /v1/messages`` responses: one Anthropic message, or its stream of events.

A stream is ``message_start`` (sent with the first output, so its usage counts the prefix cache's hit), then
per content block ``content_block_start``, its deltas (``thinking_delta``, ``text_delta``, ``input_json_delta``)
and ``content_block_stop``, then ``message_delta`` (stop reason, output tokens) and ``message_stop``; a failure
is an ``error`` event. Blocks come from the same :class:`~stagewise.server.answer_stream.AnswerStream` as chat's
chunks, so both APIs split reasoning and tool calls alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stagewise.server.answer_stream import AnswerDelta, AnswerStream, Thought, ToolCallDelta
from stagewise.server.apis import anthropic_format as fmt
from stagewise.server.chat_handler import whole_answer
from stagewise.server.choices import Choices
from stagewise.server.output_stream import ClientGone, failed, failure
from stagewise.server.request_builder import BuiltRequest


def message_id(built: BuiltRequest) -> str:
    return "msg_" + built.response_id.removeprefix("chatcmpl-")


async def respond(built: BuiltRequest, choices: Choices, model: str, request: Request) -> Response:
    if built.stream:
        return choices.stream(request, _events(built, choices, model))
    message, reason, last = await whole_answer(built, choices, request)
    return JSONResponse(fmt.message(message_id(built), model, fmt.content_blocks(message),
                                    fmt.stop_reason(reason, last), last.stop_string, fmt.usage(last)))


class _Blocks:
    """The content blocks of a stream: which one is open, and the events that open, fill and close them."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None  # the open block's type; None: none open

    def events(self, delta: AnswerDelta) -> list[str]:
        if isinstance(delta, Thought):
            return [*self._keep("thinking", {"type": "thinking", "thinking": "", "signature": ""}),
                    self._delta({"type": "thinking_delta", "thinking": delta.text})]
        if isinstance(delta, ToolCallDelta):
            out = []
            if delta.id is not None:  # a call's first delta: a block of its own
                out = self._open("tool_use", {"type": "tool_use", "id": delta.id, "name": delta.name, "input": {}})
            if delta.arguments:
                out.append(self._delta({"type": "input_json_delta", "partial_json": delta.arguments}))
            return out
        return [*self._keep("text", {"type": "text", "text": ""}), self._delta({"type": "text_delta", "text": delta})]

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [fmt.event({"type": "content_block_stop", "index": self.index})]

    def _keep(self, kind: str, block: dict[str, Any]) -> list[str]:
        return [] if self.kind == kind else self._open(kind, block)

    def _open(self, kind: str, block: dict[str, Any]) -> list[str]:
        out = self.close()
        self.index, self.kind = self.index + 1, kind
        return [*out, fmt.event({"type": "content_block_start", "index": self.index, "content_block": block})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return fmt.event({"type": "content_block_delta", "index": self.index, "delta": delta})


async def _events(built: BuiltRequest, choices: Choices, model: str) -> AsyncIterator[str]:
    answer, blocks = AnswerStream(built), _Blocks()
    started = False
    try:
        while True:
            _, out = await choices.get()
            if failed(out):
                error = failure(out)
                yield fmt.event(fmt.error_body(error.http_status, str(error)))
                return
            if not started:
                use = {**fmt.usage(out), "output_tokens": 0}
                yield fmt.event({"type": "message_start",
                                 "message": fmt.message(message_id(built), model, [], None, None, use)})
                started = True
            for delta in answer.push(out):
                for event in blocks.events(delta):
                    yield event
            if out.finished:
                for event in blocks.close():
                    yield event
                reason = fmt.stop_reason("tool_calls" if answer.called(out) else str(out.finish_reason), out)
                yield fmt.event({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": out.stop_string},
                                 "usage": {"output_tokens": out.completion_tokens}})
                yield fmt.event({"type": "message_stop"})
                return
    except ClientGone:
        return  # nobody to tell; the engine request is cancelled below
    finally:
        choices.cancel()
