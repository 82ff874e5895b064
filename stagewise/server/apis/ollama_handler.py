"""Ollama's API responses: ``/api/chat`` and ``/api/generate`` (one JSON object, or newline-delimited JSON chunks,
Ollama's default), and the model's descriptions (``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``).

A chunk carries the new text (``message.content`` / ``response``) and reasoning (``thinking``); tool calls come
whole (arguments as an object) in the chunk before the last; the last has ``done: true``, ``done_reason``
(``stop`` or ``length``), the token counts and the durations in nanoseconds (``prompt_eval_duration``: to the
first token; ``eval_duration``: the rest; ``load_duration`` 0, the model being loaded already). Chunks come from
the same :class:`~stagewise.server.answer_stream.AnswerStream` as chat's.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stagewise import __version__
from stagewise.engine.reasoning_stream import has_reasoning_tags
from stagewise.engine.request_output import RequestOutput
from stagewise.server.answer_stream import AnswerStream, Thought, ToolCallDelta
from stagewise.server.chat_handler import whole_answer
from stagewise.server.choices import Choices
from stagewise.server.model_facts import ModelFacts
from stagewise.server.output_stream import ClientGone, failed, failure
from stagewise.server.request_builder import BuiltRequest

NDJSON = "application/x-ndjson"
_NS = 1_000_000_000


def now() -> str:
    """Ollama's ``created_at``: RFC 3339 in UTC."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _done(model: str, last: RequestOutput, started_s: float, first_s: float | None) -> dict[str, Any]:
    ended_s = time.perf_counter()
    first_s = first_s if first_s is not None else ended_s
    return {"model": model, "created_at": now(), "done": True,
            "done_reason": "length" if last.finish_reason == "length" else "stop",
            "total_duration": int((ended_s - started_s) * _NS), "load_duration": 0,
            "prompt_eval_count": last.prompt_tokens, "prompt_eval_duration": int((first_s - started_s) * _NS),
            "eval_count": last.completion_tokens, "eval_duration": int((ended_s - first_s) * _NS)}


def _calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool calls as Ollama's: ``{"function": {"name", "arguments": {object}}}``."""
    out = []
    for call in calls:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except json.JSONDecodeError:
            arguments = None
        out.append({"id": call["id"], "function": {"name": call["function"]["name"],
                                                    "arguments": arguments if isinstance(arguments, dict) else {}}})
    return out


def responder(generate: bool) -> Callable[[BuiltRequest, Choices, str, Request], Any]:
    """The ``respond`` of ``/api/generate`` (``generate``) or ``/api/chat``."""

    async def respond(built: BuiltRequest, choices: Choices, model: str, request: Request) -> Response:
        started_s = time.perf_counter()
        if built.stream:
            return choices.stream(request, _chunks(built, choices, model, started_s, generate), NDJSON)
        message, _, last = await whole_answer(built, choices, request)
        body = _done(model, last, started_s, choices.first_output_s)
        if generate:
            body["response"] = message.get("content") or ""
        else:
            body["message"] = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                body["message"]["tool_calls"] = _calls(message["tool_calls"])
        if message.get("reasoning_content"):
            (body if generate else body["message"])["thinking"] = message["reasoning_content"]
        return JSONResponse(body)

    return respond


async def _chunks(built: BuiltRequest, choices: Choices, model: str, started_s: float,
                  generate: bool) -> AsyncIterator[str]:
    answer = AnswerStream(built)
    calls: dict[int, dict[str, Any]] = {}  # tool calls as their pieces arrive, sent whole at the end

    def line(text: str = "", thinking: str = "", tool_calls: list[dict[str, Any]] | None = None,
             done: dict[str, Any] | None = None) -> str:
        body = done or {"model": model, "created_at": now(), "done": False}
        if generate:
            body["response"] = text
            if thinking:
                body["thinking"] = thinking
        else:
            body["message"] = {"role": "assistant", "content": text}
            if thinking:
                body["message"]["thinking"] = thinking
            if tool_calls:
                body["message"]["tool_calls"] = tool_calls
        return json.dumps(body, ensure_ascii=False) + "\n"
    try:
        while True:
            _, out = await choices.get()
            if failed(out):
                yield json.dumps({"error": str(failure(out))}) + "\n"
                return
            for delta in answer.push(out):
                if isinstance(delta, Thought):
                    yield line(thinking=delta.text)
                elif isinstance(delta, ToolCallDelta):
                    call = calls.setdefault(delta.index, {"id": delta.id, "type": "function",
                                                          "function": {"name": delta.name, "arguments": ""}})
                    call["function"]["arguments"] += delta.arguments
                else:
                    yield line(delta)
            if out.finished:
                if calls:
                    yield line(tool_calls=_calls([calls[i] for i in sorted(calls)]))
                yield line(done=_done(model, out, started_s, choices.first_output_s))
                return
    except ClientGone:
        return  # nobody to tell; the engine request is cancelled below
    finally:
        choices.cancel()


def _details(model: ModelFacts) -> dict[str, Any]:
    family = str(model.placement.get("architecture") or "")
    return {"format": "", "family": family, "families": [family] if family else None, "parameter_size": "",
            "quantization_level": ""}


def _size_bytes(model: ModelFacts) -> int:
    return sum(int(s["planned"].get("weights_bytes", 0)) for s in model.placement.get("stages", []))


def tags(name: str, model: ModelFacts, loaded_at: str) -> dict[str, Any]:
    """``/api/tags``: the one model served."""
    return {"models": [{"name": name, "model": name, "modified_at": loaded_at, "size": _size_bytes(model),
                        "digest": "", "details": _details(model)}]}


def running(name: str, model: ModelFacts) -> dict[str, Any]:
    """``/api/ps``: the one model, loaded for as long as the server runs."""
    return {"models": [{"name": name, "model": name, "size": _size_bytes(model), "digest": "",
                        "details": _details(model), "expires_at": "9999-12-31T23:59:59Z",
                        "size_vram": _size_bytes(model), "context_length": model.max_context}]}


def show(model: ModelFacts) -> dict[str, Any]:
    """``/api/show``: the template, the context length and what the model can do."""
    capabilities = ["completion"]
    if "tools" in model.chat_template.source:  # a template that renders the offered tools
        capabilities.append("tools")
    if has_reasoning_tags(model.chat_template.source):
        capabilities.append("thinking")
    architecture = model.placement.get("architecture") or "unknown"
    return {"modelfile": "", "parameters": "", "template": model.chat_template.source, "details": _details(model),
            "model_info": {"general.architecture": architecture, f"{architecture}.context_length": model.max_context},
            "capabilities": capabilities}


def version() -> dict[str, str]:
    return {"version": __version__}
