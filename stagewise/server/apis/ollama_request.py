"""Ollama requests read as chat (or, ``raw``, text completion) requests: one path from there on.

``/api/chat``: messages (``thinking`` as ``reasoning_content``, ``tool_calls`` with object arguments, tool results
by ``tool_name``), ``tools`` (OpenAI's shape already). ``/api/generate``: ``system`` and ``prompt`` as a chat turn,
or with ``raw`` the prompt as it is. Both: ``format`` (``"json"`` or a JSON schema) as ``response_format``,
``think`` as the template's ``enable_thinking``, and the ``options`` this server applies: ``num_predict`` (a
negative one: until the context ends), ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``,
``presence_penalty``, ``frequency_penalty``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from stagewise.server.apis.ollama_schemas import OllamaChatBody, OllamaGenerateBody, OllamaGeneration, OllamaMessage
from stagewise.server.model_facts import ModelFacts
from stagewise.server.openai_errors import InvalidParam, from_validation
from stagewise.server.request_builder import BuiltRequest, build_chat_as, build_completion, chat_request
from stagewise.server.schemas import CompletionBody

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty")
_PARAMS = {"max_tokens": "options.num_predict", "stop": "options.stop", "response_format": "format"}


def _options(body: OllamaGeneration) -> dict[str, Any]:
    """The chat fields of ``options``, ``format`` and ``think``."""
    options = body.options or {}
    fields = {name: options[name] for name in _SAMPLING if options.get(name) is not None}
    predict = options.get("num_predict")
    if predict is not None:
        if isinstance(predict, bool) or not isinstance(predict, int):
            raise InvalidParam("options.num_predict must be an integer", "options.num_predict")
        fields["max_tokens"] = predict if predict >= 0 else None
    if body.format == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(body.format, dict):
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": body.format}}
    elif body.format not in (None, ""):
        raise InvalidParam("format is \"json\" or a JSON schema", "format")
    fields["stream"] = body.stream
    return fields


def _message(message: OllamaMessage, index: int) -> dict[str, Any]:
    at = f"messages.{index}"
    if message.images:
        raise InvalidParam("image input is not supported", f"{at}.images")
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.thinking:
        out["reasoning_content"] = message.thinking
    if message.tool_calls:
        calls = []
        for j, call in enumerate(message.tool_calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise InvalidParam("a tool call is {'function': {'name': ..., 'arguments': {...}}}", f"{at}.tool_calls.{j}")
            arguments = function.get("arguments", {})
            text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            calls.append({"id": str(call.get("id") or f"call_{index}_{j}"), "type": "function",
                          "function": {"name": function["name"], "arguments": text}})
        out["tool_calls"] = calls
        out["content"] = message.content or None
    if message.role == "tool" and message.tool_name:
        out["name"] = message.tool_name
    return out


def build_ollama_chat(body: OllamaChatBody, model: ModelFacts, request_id: str, split_reasoning: bool = True,
                      template_kwargs: dict[str, Any] | None = None) -> BuiltRequest:
    """The engine request of ``/api/chat`` (as :func:`build_chat`; errors name Ollama's fields)."""
    fields = {"messages": [_message(m, i) for i, m in enumerate(body.messages)], **_options(body)}
    if body.tools:
        fields["tools"] = body.tools
    if body.think is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": body.think}
    return build_chat_as(_PARAMS, chat_request(fields), model, request_id, split_reasoning, template_kwargs)


def build_ollama_generate(body: OllamaGenerateBody, model: ModelFacts, request_id: str, split_reasoning: bool = True,
                          template_kwargs: dict[str, Any] | None = None) -> BuiltRequest:
    """The engine request of ``/api/generate``: the prompt (and ``system``) as a chat turn, or with ``raw`` as
    a text completion's prompt."""
    if body.images:
        raise InvalidParam("image input is not supported", "images")
    if body.suffix:
        raise InvalidParam("suffix is not supported", "suffix")
    fields = _options(body)
    if body.raw:
        try:
            completion = CompletionBody.model_validate({"prompt": body.prompt, **fields})
        except ValidationError as exc:
            raise from_validation(exc) from exc
        return build_completion(completion, model, request_id, default_max_tokens=None)
    messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
        {"role": "user", "content": body.prompt}]
    if body.think is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": body.think}
    return build_chat_as({**_PARAMS, "messages": "prompt"}, chat_request({"messages": messages, **fields}), model,
                         request_id, split_reasoning, template_kwargs)
