"""``POST /v1/responses`` responses: one ``response`` object, or its stream of events.

A stream is ``response.created`` and ``response.in_progress``, then per output item ``response.output_item.added``,
its part and deltas (``response.reasoning_text.delta``, ``response.output_text.delta``,
``response.function_call_arguments.delta``) and their ``.done`` events, ``response.output_item.done``; last
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it off) with the whole response.
A failure is an ``error`` event. Items come from the same :class:`~stagewise.server.answer_stream.AnswerStream`
as chat's chunks.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stagewise.server.answer_stream import AnswerDelta, AnswerStream, Thought, ToolCallDelta
from stagewise.server.apis import responses_format as fmt
from stagewise.server.chat_handler import whole_answer
from stagewise.server.choices import Choices
from stagewise.server.output_stream import ClientGone, failed, failure
from stagewise.server.request_builder import BuiltRequest


def _ids(built: BuiltRequest) -> str:
    return built.response_id.removeprefix("chatcmpl-")


async def respond(built: BuiltRequest, choices: Choices, model: str, request: Request) -> Response:
    if built.stream:
        return choices.stream(request, _events(built, choices, model))
    message, reason, last = await whole_answer(built, choices, request)
    status = "incomplete" if reason == "length" else "completed"
    rid = _ids(built)
    return JSONResponse(fmt.response(f"resp_{rid}", int(time.time()), model, built.response_fields, status,
                                     fmt.output_items(message, rid, status), fmt.usage(last)))


class _Items:
    """The output items of a stream: which one is open, and the events that open, fill and close them."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.output: list[dict[str, Any]] = []  # the items closed so far, as the final response lists them
        self.kind: str | None = None  # the open item's type; None: none open
        self.item_id, self.text, self.call = "", "", ("", "")  # the open item's id, text so far, (call id, name)
        self.messages = 0

    def events(self, delta: AnswerDelta) -> list[dict[str, Any]]:
        if isinstance(delta, Thought):
            out = self._keep("reasoning")
            self.text += delta.text
            return [*out, self._at({"type": "response.reasoning_text.delta", "content_index": 0, "delta": delta.text})]
        if isinstance(delta, ToolCallDelta):
            out = []
            if delta.id is not None:  # a call's first delta: an item of its own
                out = self._open("function_call", f"fc_{delta.id}", (delta.id, str(delta.name)))
            if delta.arguments:
                self.text += delta.arguments
                out.append(self._at({"type": "response.function_call_arguments.delta", "delta": delta.arguments}))
            return out
        out = self._keep("message")
        self.text += delta
        return [*out, self._at({"type": "response.output_text.delta", "content_index": 0, "delta": delta,
                                "logprobs": []})]

    def close(self, status: str) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        text, kind = self.text, self.kind
        if kind == "reasoning":
            item = fmt.reasoning_item(self.item_id, text, "completed")
            out = [self._at({"type": "response.reasoning_text.done", "content_index": 0, "text": text}),
                   self._at({"type": "response.content_part.done", "content_index": 0,
                             "part": {"type": "reasoning_text", "text": text}})]
        elif kind == "message":
            item = fmt.message_item(self.item_id, text, status)
            out = [self._at({"type": "response.output_text.done", "content_index": 0, "text": text, "logprobs": []}),
                   self._at({"type": "response.content_part.done", "content_index": 0, "part": fmt.text_part(text)})]
        else:
            item = fmt.call_item(self.call[0], self.call[1], text, "completed")
            out = [self._at({"type": "response.function_call_arguments.done", "arguments": text})]
        out.append({"type": "response.output_item.done", "output_index": len(self.output), "item": item})
        self.output.append(item)
        self.kind = None
        return out

    def _keep(self, kind: str) -> list[dict[str, Any]]:
        if self.kind == kind:
            return []
        if kind == "reasoning":
            return self._open(kind, f"rs_{self.rid}")
        self.messages += 1
        return self._open(kind, f"msg_{self.rid}" if self.messages == 1 else f"msg_{self.rid}_{self.messages}")

    def _open(self, kind: str, item_id: str, call: tuple[str, str] = ("", "")) -> list[dict[str, Any]]:
        out = self.close("completed")
        self.kind, self.item_id, self.text, self.call = kind, item_id, "", call
        if kind == "reasoning":
            item, part = fmt.reasoning_item(item_id, "", "in_progress"), {"type": "reasoning_text", "text": ""}
        elif kind == "message":
            item, part = fmt.message_item(item_id, None, "in_progress"), fmt.text_part("")
        else:
            item, part = fmt.call_item(call[0], call[1], "", "in_progress"), None
        out.append({"type": "response.output_item.added", "output_index": len(self.output), "item": item})
        if part is not None:
            out.append(self._at({"type": "response.content_part.added", "content_index": 0, "part": part}))
        return out

    def _at(self, event: dict[str, Any]) -> dict[str, Any]:
        return {**event, "item_id": self.item_id, "output_index": len(self.output)}


async def _events(built: BuiltRequest, choices: Choices, model: str) -> AsyncIterator[str]:
    rid, created = _ids(built), int(time.time())
    answer, items = AnswerStream(built), _Items(rid)
    sequence = 0

    def sse(event: dict[str, Any]) -> str:
        nonlocal sequence
        event["sequence_number"], sequence = sequence, sequence + 1
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    def whole(status: str, use: dict[str, Any] | None = None) -> dict[str, Any]:
        return fmt.response(f"resp_{rid}", created, model, built.response_fields, status, list(items.output), use)
    try:
        yield sse({"type": "response.created", "response": whole("in_progress")})
        yield sse({"type": "response.in_progress", "response": whole("in_progress")})
        while True:
            _, out = await choices.get()
            if failed(out):
                error = failure(out)
                yield sse({"type": "error", "code": error.code, "message": str(error),
                           "param": getattr(error, "param", None)})
                return
            for delta in answer.push(out):
                for event in items.events(delta):
                    yield sse(event)
            if out.finished:
                status = "incomplete" if out.finish_reason == "length" else "completed"
                for event in items.close(status):
                    yield sse(event)
                yield sse({"type": f"response.{status}", "response": whole(status, fmt.usage(out))})
                return
    except ClientGone:
        return  # nobody to tell; the engine request is cancelled below
    finally:
        choices.cancel()
