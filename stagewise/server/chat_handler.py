"""``POST /v1/chat/completions`` responses: one JSON object, or SSE chunks as OpenAI streams them."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stagewise.engine.cut_off_calls import cut_off_calls
from stagewise.engine.reasoning_stream import split_reasoning
from stagewise.engine.request_output import RequestOutput, TokenLogprob
from stagewise.engine.tool_calls import parse_tool_calls
from stagewise.server import openai_format as fmt
from stagewise.server.answer_stream import AnswerDelta, AnswerStream, Thought, ToolCallDelta
from stagewise.server.choices import Choices
from stagewise.server.openai_errors import typed_error_body
from stagewise.server.output_stream import ClientGone, failed, failure
from stagewise.server.request_builder import BuiltRequest


def final_message(text: str, built: BuiltRequest, finish_reason: str) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason: a thinking model's reasoning apart (``reasoning_content``, and
    ``reasoning`` as vLLM names it), then tool calls parsed out of the answer when tools were offered."""
    reasoning = None
    if built.reasoning is not None:
        reasoning, text = split_reasoning(text, built.reasoning)
    message, reason = _answer(text, built, finish_reason)
    if reasoning:
        message["reasoning_content"] = message["reasoning"] = reasoning
    return message, reason


async def whole_answer(built: BuiltRequest, choices: Choices, request: Request) -> tuple[dict[str, Any], str, RequestOutput]:
    """The one choice's whole answer, once it is finished: its message (:func:`final_message`), finish reason and
    last output (the other APIs' responses, which have no ``n``)."""
    outputs = (await choices.collect(request))[0]
    message, reason = final_message("".join(o.text for o in outputs), built, str(outputs[-1].finish_reason))
    return message, reason, outputs[-1]


def _answer(text: str, built: BuiltRequest, finish_reason: str) -> tuple[dict[str, Any], str]:
    """The message of an answer; an output cut off by ``max_tokens`` keeps the call written so far and
    finishes ``length``."""
    if built.tool_format is not None and finish_reason == "length":
        parsed = cut_off_calls(text, built.tool_format, built.forced_tools, random.Random(), built.tool_params)
        if parsed.calls:
            calls = [call.to_openai() for call in parsed.calls]
            return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, "length"
        return {"role": "assistant", "content": parsed.content if not built.forced_tools else None}, "length"
    if built.tool_format is not None:
        parsed = parse_tool_calls(text, built.tool_format, random.Random(), built.tool_params)
        if parsed.calls:
            calls = [call.to_openai() for call in parsed.calls]
            return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": text}, finish_reason


async def respond(built: BuiltRequest, choices: Choices, model: str, request: Request) -> Response:
    if built.stream:
        return choices.stream(request, _events(built, choices, model))
    outputs = await choices.collect(request)
    body_choices = []
    for index, outs in enumerate(outputs):
        message, reason = final_message("".join(o.text for o in outs), built, str(outs[-1].finish_reason))
        entries: list[TokenLogprob] = [e for o in outs for e in o.logprobs]
        logprobs = fmt.chat_logprobs(entries) if built.request.logprobs else None
        body_choices.append(fmt.chat_choice(index, message, reason, logprobs, outs[-1].stop_string))
    use = fmt.usage(outputs[0][-1].prompt_tokens, sum(outs[-1].completion_tokens for outs in outputs),
                    outputs[0][-1].cached_tokens)
    return JSONResponse(fmt.chat_completion(built.response_id, int(time.time()), model, body_choices, use))


async def _events(built: BuiltRequest, choices: Choices, model: str) -> AsyncIterator[str]:
    created = int(time.time())
    rid = built.response_id
    usage_on = built.include_usage

    def chunk(index: int, delta: dict[str, Any] | None, reason: str | None = None,
              logprobs: dict[str, Any] | None = None, use: dict[str, int] | None = None,
              stop_reason: str | None = None) -> str:
        return fmt.sse(fmt.chat_chunk(rid, created, model, delta, reason, logprobs, use, usage_on, index, stop_reason))

    streams = [AnswerStream(built) for _ in range(choices.n)]  # reasoning, answer and tool-call deltas

    def deltas(index: int, found: list[AnswerDelta], logprobs: dict[str, Any] | None) -> Iterator[str]:
        """Chunks for the deltas; logprobs ride on the first (or on an empty content delta)."""
        for delta in found:
            if isinstance(delta, Thought):
                yield chunk(index, {"reasoning_content": delta.text, "reasoning": delta.text}, logprobs=logprobs)
            elif isinstance(delta, ToolCallDelta):
                yield chunk(index, {"tool_calls": [delta.to_openai()]}, logprobs=logprobs)
            else:
                yield chunk(index, {"content": delta}, logprobs=logprobs)
            logprobs = None
        if logprobs:
            yield chunk(index, {"content": ""}, logprobs=logprobs)
    completion_tokens = [0] * choices.n
    cached_tokens = [0] * choices.n  # the prompt's tokens each choice took from the prefix cache
    prompt_tokens = 0
    finished = 0
    try:
        for index in range(choices.n):
            yield chunk(index, {"role": "assistant", "content": ""})
        while finished < choices.n:
            index, out = await choices.get()
            if failed(out):
                yield fmt.sse(typed_error_body(failure(out)))
                break
            logprobs = fmt.chat_logprobs(out.logprobs) if out.logprobs else None
            for event in deltas(index, streams[index].push(out), logprobs):
                yield event
            if out.finished:
                reason = "tool_calls" if streams[index].called(out) else str(out.finish_reason)
                yield chunk(index, {}, reason, stop_reason=out.stop_string)
                finished += 1
                completion_tokens[index], prompt_tokens = out.completion_tokens, out.prompt_tokens
                cached_tokens[index] = out.cached_tokens
        else:
            if usage_on:
                yield chunk(0, None, use=fmt.usage(prompt_tokens, sum(completion_tokens), cached_tokens[0]))
        yield fmt.sse("[DONE]")
    except ClientGone:
        return  # nobody to tell; the engine requests are cancelled below
    finally:
        choices.cancel()
