"""Responses API requests read as chat requests: one path from there on (template, tools, sampling, grammar).

``instructions`` becomes a system message; ``input`` a user message (a string) or items: ``message`` items (roles
user, system, developer, assistant; text parts) become messages, ``function_call`` items an assistant turn's
``tool_calls`` (joined to the assistant message just before, if any), ``function_call_output`` items tool
messages, and a ``reasoning`` item the next assistant turn's ``reasoning_content``. Function tools' flat shape
becomes chat's, ``text.format`` the ``response_format``, ``max_output_tokens`` ``max_tokens``. Nothing is stored:
a ``previous_response_id`` is refused (send the whole conversation as ``input``, as ``store: false`` clients do).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stagewise.server.apis.responses_schemas import ResponsesBody
from stagewise.server.model_facts import ModelFacts
from stagewise.server.openai_errors import InvalidParam
from stagewise.server.request_builder import BuiltRequest, build_chat_as, chat_request
from stagewise.server.schemas import ChatCompletionBody

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")
# chat's field names -> the Responses API's
_PARAMS = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}


def _text(content: Any, param: str) -> str:
    """A message's text: a string, or text parts (joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidParam("content is a string or a list of text parts", param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            what = "image input is not supported" if kind == "input_image" else f"unsupported content part {kind!r}"
            raise InvalidParam(what, f"{param}.{j}")
        texts.append(part["text"])
    return "\n".join(texts)


def _string(item: dict[str, Any], key: str, at: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidParam(f"a {item.get('type')} item needs a string {key}", f"{at}.{key}")
    return value


def _messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item's text, for the assistant turn after it
    for i, item in enumerate(items):
        kind, at = item.get("type", "message"), f"input.{i}"
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise InvalidParam(f"a message's role is one of {', '.join(_ROLES)}, got {role!r}", f"{at}.role")
            message: dict[str, Any] = {"role": role, "content": _text(item.get("content"), f"{at}.content")}
            if role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            out.append(message)
        elif kind == "function_call":
            arguments = item.get("arguments", "{}")
            if not isinstance(arguments, str):
                raise InvalidParam("a function_call's arguments are a JSON string", f"{at}.arguments")
            call = {"id": _string(item, "call_id", at), "type": "function",
                    "function": {"name": _string(item, "name", at), "arguments": arguments}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if reasoning is not None:
                    out[-1]["reasoning_content"], reasoning = reasoning, None
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": _string(item, "call_id", at),
                        "content": _text(output, f"{at}.output")})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
        else:
            raise InvalidParam(f"input item type {kind!r} is not supported (message, function_call, "
                               "function_call_output and reasoning are)", f"{at}.type")
    return out


def _tool(tool: dict[str, Any], param: str) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise InvalidParam(f"tool type {tool.get('type')!r} is not supported: give function tools", f"{param}.type")
    function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
    return {"type": "function", "function": function}


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise InvalidParam("tool_choice is auto, none, required or {'type': 'function', 'name': ...}", "tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    form = (text or {}).get("format")
    if form is None or not isinstance(form, dict) or form.get("type") in ("text", "json_object"):
        return form
    if form.get("type") != "json_schema":
        raise InvalidParam(f"text.format type {form.get('type')!r} is not supported", "text.format")
    return {"type": "json_schema", "json_schema": {k: form[k] for k in ("name", "schema", "strict") if k in form}}


def chat_body(body: ResponsesBody) -> ChatCompletionBody:
    """The chat request ``body`` asks for (raises :class:`InvalidParam` naming the Responses field)."""
    if body.previous_response_id is not None:
        raise InvalidParam("responses are not stored here: send the whole conversation as input",
                           "previous_response_id")
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    messages += [{"role": "user", "content": body.input}] if isinstance(body.input, str) else _messages(body.input)
    fields: dict[str, Any] = {"messages": messages, "max_tokens": body.max_output_tokens, "stream": body.stream,
                              "temperature": body.temperature, "top_p": body.top_p,
                              "response_format": _response_format(body.text),
                              "chat_template_kwargs": body.chat_template_kwargs,
                              "reasoning_effort": (body.reasoning or {}).get("effort")}
    if body.tools:
        fields["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(body.tools)]
        fields["tool_choice"] = _tool_choice(body.tool_choice)
    return chat_request(fields)


def build_responses(body: ResponsesBody, model: ModelFacts, request_id: str, split_reasoning: bool = True,
                    template_kwargs: dict[str, Any] | None = None) -> BuiltRequest:
    """The engine request of a Responses request (as :func:`build_chat`; errors name the Responses fields)."""
    echo = {"instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature, "top_p": body.top_p, "tools": body.tools or [],
            "tool_choice": body.tool_choice or "auto", "text": body.text or {"format": {"type": "text"}},
            "parallel_tool_calls": body.parallel_tool_calls is not False}
    chat = chat_body(body)
    return replace(build_chat_as(_PARAMS, chat, model, request_id, split_reasoning, template_kwargs),
                   response_fields=echo)
