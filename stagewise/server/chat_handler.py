"""``POST /v1/chat/completions`` responses: one JSON object, or SSE chunks as OpenAI streams them."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from stagewise.engine.request_handle import RequestHandle
from stagewise.engine.request_output import TokenLogprob
from stagewise.engine.tool_calls import parse_tool_calls
from stagewise.server import openai_format as fmt
from stagewise.server.openai_errors import typed_error_body
from stagewise.server.output_stream import SSE_HEADERS, OutputStream, collect, failed, failure
from stagewise.server.request_builder import BuiltRequest


def final_message(text: str, built: BuiltRequest, finish_reason: str) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason; tool calls are parsed out when tools were offered."""
    if built.tool_format is not None:
        parsed = parse_tool_calls(text, built.tool_format, random.Random())
        if parsed.calls:
            calls = [call.to_openai() for call in parsed.calls]
            return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": text}, finish_reason


async def respond(built: BuiltRequest, handle: RequestHandle, stream: OutputStream, model: str,
                  request: Request) -> Response:
    if built.stream:
        return StreamingResponse(_events(built, handle, stream, model), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    outputs = await collect(handle, stream, request)
    last = outputs[-1]
    text = "".join(o.text for o in outputs)
    message, reason = final_message(text, built, str(last.finish_reason))
    entries: list[TokenLogprob] = [e for o in outputs for e in o.logprobs]
    logprobs = fmt.chat_logprobs(entries) if built.request.logprobs else None
    body = fmt.chat_completion(handle.request_id, int(time.time()), model, message, reason,
                               logprobs, fmt.usage(last.prompt_tokens, last.completion_tokens))
    return JSONResponse(body)


async def _events(built: BuiltRequest, handle: RequestHandle, stream: OutputStream, model: str) -> AsyncIterator[str]:
    created = int(time.time())
    rid = handle.request_id
    usage_on = built.include_usage

    def chunk(delta: dict[str, Any] | None, reason: str | None = None, logprobs: dict[str, Any] | None = None,
              use: dict[str, int] | None = None) -> str:
        return fmt.sse(fmt.chat_chunk(rid, created, model, delta, reason, logprobs, use, usage_on))

    buffered: list[str] = []  # with tools offered, the text is held until it can be parsed
    try:
        yield chunk({"role": "assistant", "content": ""})
        while True:
            out = await stream.get()
            if failed(out):
                yield fmt.sse(typed_error_body(failure(out)))
                break
            logprobs = fmt.chat_logprobs(out.logprobs) if out.logprobs else None
            if built.tool_format is not None:
                buffered.append(out.text)
                if logprobs:
                    yield chunk({}, logprobs=logprobs)
            elif out.text or logprobs:
                yield chunk({"content": out.text}, logprobs=logprobs)
            if out.finished:
                reason = str(out.finish_reason)
                if built.tool_format is not None:
                    message, reason = final_message("".join(buffered), built, reason)
                    delta = {k: v for k, v in message.items() if k != "role" and v is not None}
                    if "tool_calls" in delta:
                        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
                    if delta:
                        yield chunk(delta)
                yield chunk({}, reason)
                if usage_on:
                    yield chunk(None, use=fmt.usage(out.prompt_tokens, out.completion_tokens))
                break
        yield fmt.sse("[DONE]")
    finally:
        if not handle.done:
            handle.cancel()
