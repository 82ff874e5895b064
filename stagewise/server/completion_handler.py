"""``POST /v1/completions`` responses: one ``text_completion`` object, or SSE chunks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stagewise.engine.request_output import TokenLogprob
from stagewise.server import openai_format as fmt
from stagewise.server.choices import Choices
from stagewise.server.openai_errors import typed_error_body
from stagewise.server.output_stream import ClientGone, failed, failure
from stagewise.server.request_builder import BuiltRequest


async def respond(built: BuiltRequest, choices: Choices, model: str, request: Request) -> Response:
    if built.stream:
        return choices.stream(request, _events(built, choices, model))
    outputs = await choices.collect(request)
    body_choices = []
    for index, outs in enumerate(outputs):
        entries: list[TokenLogprob] = [e for o in outs for e in o.logprobs]
        logprobs = fmt.completion_logprobs(entries) if built.request.logprobs else None
        body_choices.append(fmt.text_choice(index, "".join(o.text for o in outs), outs[-1].finish_reason, logprobs,
                                            outs[-1].stop_string))
    firsts = built.first_of_each_prompt([outs[-1] for outs in outputs])  # usage counts each prompt once
    use = fmt.usage(sum(o.prompt_tokens for o in firsts), sum(outs[-1].completion_tokens for outs in outputs),
                    sum(o.cached_tokens for o in firsts))
    return JSONResponse(fmt.text_completion(built.response_id, int(time.time()), model, body_choices, use))


async def _events(built: BuiltRequest, choices: Choices, model: str) -> AsyncIterator[str]:
    created = int(time.time())
    rid = built.response_id
    offsets = [0] * choices.n
    completion_tokens = [0] * choices.n
    prompt_tokens = [0] * choices.n
    cached_tokens = [0] * choices.n  # the prompt's tokens each choice took from the prefix cache
    finished = 0
    try:
        while finished < choices.n:
            index, out = await choices.get()
            if failed(out):
                yield fmt.sse(typed_error_body(failure(out)))
                break
            logprobs = fmt.completion_logprobs(out.logprobs, offsets[index]) if built.request.logprobs else None
            offsets[index] += sum(len(e.token) for e in out.logprobs)
            if out.text or out.logprobs or out.finished:
                choice = fmt.text_choice(index, out.text, out.finish_reason, logprobs, out.stop_string)
                yield fmt.sse(fmt.text_completion(rid, created, model, [choice], None, chunk=True))
            if out.finished:
                finished += 1
                completion_tokens[index], prompt_tokens[index] = out.completion_tokens, out.prompt_tokens
                cached_tokens[index] = out.cached_tokens
        else:
            if built.include_usage:
                use = fmt.usage(sum(built.first_of_each_prompt(prompt_tokens)), sum(completion_tokens),
                                sum(built.first_of_each_prompt(cached_tokens)))
                yield fmt.sse(fmt.text_completion(rid, created, model, [], use, chunk=True))
        yield fmt.sse("[DONE]")
    except ClientGone:
        return  # nobody to tell; the engine requests are cancelled below
    finally:
        choices.cancel()
