"""OpenAI response objects: chat completions (full and chunks), text completions, logprobs, usage."""

from __future__ import annotations

import json
from typing import Any

from stagewise.engine.request_output import TokenLogprob


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """Token counts; with ``n`` choices the prompt counts once and ``completion_tokens`` is their sum;
    ``cached_tokens`` (as OpenAI): the prompt tokens served from the prefix cache (the first choice's)."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def chat_logprobs(entries: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict[str, Any]:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``."""
    return {"content": [
        {"token": e.token, "logprob": e.logprob, "bytes": list(e.bytes),
         "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)} for t, lp, b in e.top]}
        for e in entries
    ]}


def completion_logprobs(entries: tuple[TokenLogprob, ...] | list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """Legacy completions shape: parallel ``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset``."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{t: lp for t, lp, _ in e.top} for e in entries],
        "text_offset": offsets,
    }


def chat_choice(index: int, message: dict[str, Any], finish_reason: str,
                logprobs: dict[str, Any] | None, stop_reason: str | None = None) -> dict[str, Any]:
    """One choice; ``stop_reason`` (vLLM's field): the stop string that ended it, else None."""
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def chat_completion(request_id: str, created: int, model: str, choices: list[dict[str, Any]],
                    use: dict[str, int]) -> dict[str, Any]:
    """A ``chat.completion`` of :func:`chat_choice` s."""
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": use}


def chat_chunk(request_id: str, created: int, model: str, delta: dict[str, Any] | None,
               finish_reason: str | None = None, logprobs: dict[str, Any] | None = None,
               use: dict[str, int] | None = None, include_usage: bool = False, index: int = 0,
               stop_reason: str | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of choice ``index``; ``delta=None`` gives the usage-only chunk (empty choices);
    the chunk that finishes a choice carries ``stop_reason`` (:func:`chat_choice`)."""
    chunk: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                             "choices": []}
    if delta is not None:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        chunk["choices"] = [choice]
    if include_usage:
        chunk["usage"] = use
    return chunk


def text_choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None,
                stop_reason: str | None = None) -> dict[str, Any]:
    """One text choice (or a streamed piece of one); ``stop_reason`` as :func:`chat_choice`'s."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def text_completion(request_id: str, created: int, model: str, choices: list[dict[str, Any]],
                    use: dict[str, int] | None, chunk: bool = False) -> dict[str, Any]:
    """A ``text_completion`` of :func:`text_choice` s (a streamed chunk carries usage only when given)."""
    body: dict[str, Any] = {"id": request_id, "object": "text_completion", "created": created, "model": model,
                            "choices": choices}
    if use is not None or not chunk:
        body["usage"] = use
    return body


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"
