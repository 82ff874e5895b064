"""``POST /v1/completions`` responses: one ``text_completion`` object, or SSE chunks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from stagewise.engine.request_handle import RequestHandle
from stagewise.engine.request_output import TokenLogprob
from stagewise.server import openai_format as fmt
from stagewise.server.openai_errors import typed_error_body
from stagewise.server.output_stream import SSE_HEADERS, OutputStream, collect, failed, failure
from stagewise.server.request_builder import BuiltRequest


async def respond(built: BuiltRequest, handle: RequestHandle, stream: OutputStream, model: str,
                  request: Request) -> Response:
    if built.stream:
        return StreamingResponse(_events(built, handle, stream, model), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    outputs = await collect(handle, stream, request)
    last = outputs[-1]
    entries: list[TokenLogprob] = [e for o in outputs for e in o.logprobs]
    logprobs = fmt.completion_logprobs(entries) if built.request.logprobs else None
    body = fmt.text_completion(handle.request_id, int(time.time()), model, "".join(o.text for o in outputs),
                               last.finish_reason, logprobs, fmt.usage(last.prompt_tokens, last.completion_tokens))
    return JSONResponse(body)


async def _events(built: BuiltRequest, handle: RequestHandle, stream: OutputStream, model: str) -> AsyncIterator[str]:
    created = int(time.time())
    offset = 0
    try:
        while True:
            out = await stream.get()
            if failed(out):
                yield fmt.sse(typed_error_body(failure(out)))
                break
            logprobs = fmt.completion_logprobs(out.logprobs, offset) if built.request.logprobs else None
            offset += sum(len(e.token) for e in out.logprobs)
            if out.text or out.logprobs or out.finished:
                yield fmt.sse(fmt.text_completion(handle.request_id, created, model, out.text, out.finish_reason,
                                                  logprobs, None, chunk=True))
            if out.finished:
                if built.include_usage:
                    use = fmt.usage(out.prompt_tokens, out.completion_tokens)
                    yield fmt.sse({"id": handle.request_id, "object": "text_completion", "created": created,
                                   "model": model, "choices": [], "usage": use})
                break
        yield fmt.sse("[DONE]")
    finally:
        if not handle.done:
            handle.cancel()
