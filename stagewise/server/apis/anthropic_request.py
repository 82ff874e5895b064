"""Anthropic Messages requests read as chat requests: one path from there on (template, tools, sampling, grammar).

``system`` becomes a system message; a user turn's ``tool_result`` blocks become tool messages (before its text);
an assistant turn's ``text``, ``thinking`` and ``tool_use`` blocks become its content, ``reasoning_content`` and
``tool_calls``; tools' ``input_schema`` their ``parameters``; ``tool_choice`` ``any`` / ``tool`` / ``none`` is
``required`` / the named function / ``none``; ``thinking`` ``enabled`` / ``disabled`` sets the template's
``enable_thinking`` (absent: the template's own default); ``stop_sequences`` are stop strings.
"""

from __future__ import annotations

import json
from typing import Any

from stagewise.engine.request import MAX_STOP_STRINGS
from stagewise.server.apis.anthropic_schemas import (
    AnthropicMessage,
    AnthropicTool,
    AnthropicToolChoice,
    CountTokensBody,
    MessagesBody,
)
from stagewise.server.model_facts import ModelFacts
from stagewise.server.openai_errors import InvalidParam
from stagewise.server.request_builder import (
    BuiltRequest,
    build_chat_as,
    chat_prompt,
    chat_request,
    prompt_ids,
)
from stagewise.server.schemas import ChatCompletionBody

_UNSUPPORTED = {"image": "image input is not supported", "document": "document input is not supported"}
_PARAMS = {"stop": "stop_sequences", "max_completion_tokens": "max_tokens", "messages": "messages"}  # chat's → Anthropic's


def _text(content: str | list[dict[str, Any]], param: str) -> str:
    """The text of ``content``: a string, or text blocks (joined)."""
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(content):
        kind = block.get("type")
        if kind in _UNSUPPORTED:
            raise InvalidParam(_UNSUPPORTED[kind], f"{param}.{i}")
        if kind != "text" or not isinstance(block.get("text"), str):
            raise InvalidParam(f"expected a text block, got type {kind!r}", f"{param}.{i}")
        texts.append(block["text"])
    return "\n".join(texts)


def _user(message: AnthropicMessage, param: str) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(message.content):
        kind, at = block.get("type"), f"{param}.content.{j}"
        if kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidParam("a tool_result block needs its tool_use_id", f"{at}.tool_use_id")
            result = block.get("content", "")
            if not isinstance(result, (str, list)):
                raise InvalidParam("a tool_result's content is a string or text blocks", f"{at}.content")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(result, f"{at}.content")})
        else:
            texts.append(_block_text(block, at))
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _block_text(block: dict[str, Any], at: str) -> str:
    kind = block.get("type")
    if kind in _UNSUPPORTED:
        raise InvalidParam(_UNSUPPORTED[kind], at)
    if kind != "text" or not isinstance(block.get("text"), str):
        raise InvalidParam(f"a user turn takes text and tool_result blocks, got type {kind!r}", at)
    return str(block["text"])


def _assistant(message: AnthropicMessage, param: str) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    texts, thoughts, calls = [], [], []
    for j, block in enumerate(message.content):
        kind, at = block.get("type"), f"{param}.content.{j}"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # another model's encrypted reasoning: nothing this one can read
        elif kind == "tool_use":
            name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, dict):
                raise InvalidParam("a tool_use block needs a string id and name and an object input", at)
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
        else:
            raise InvalidParam(f"an assistant turn takes text, thinking and tool_use blocks, got type {kind!r}", at)
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if thoughts:
        out["reasoning_content"] = "\n".join(thoughts)
    if calls:
        out["tool_calls"] = calls
    return out


def _tool(tool: AnthropicTool, param: str) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise InvalidParam(f"server tool {tool.type!r} is not supported: give client tools (name, input_schema)", param)
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema or {"type": "object"}}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _tool_choice(choice: AnthropicToolChoice | None) -> str | dict[str, Any] | None:
    if choice is None or choice.type == "auto":
        return None
    if choice.type == "tool":
        if not choice.name:
            raise InvalidParam("tool_choice of type 'tool' needs the tool's name", "tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return "required" if choice.type == "any" else "none"


def chat_body(body: CountTokensBody) -> ChatCompletionBody:
    """The chat request ``body`` asks for (raises :class:`InvalidParam` naming the Anthropic field)."""
    messages: list[dict[str, Any]] = []
    if body.system:
        messages.append({"role": "system", "content": _text(body.system, "system")})
    for i, message in enumerate(body.messages):
        messages += _user(message, f"messages.{i}") if message.role == "user" else [_assistant(message, f"messages.{i}")]
    if body.messages and body.messages[-1].role == "assistant":
        raise InvalidParam("a last assistant turn (a prefill to continue) is not supported: end with a user turn",
                           f"messages.{len(body.messages) - 1}")
    fields: dict[str, Any] = {"messages": messages}
    if body.tools:
        fields["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(body.tools)]
        fields["tool_choice"] = _tool_choice(body.tool_choice)
    if body.thinking is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": body.thinking.type != "disabled"}
    if isinstance(body, MessagesBody):
        if len(body.stop_sequences or ()) > MAX_STOP_STRINGS:
            raise InvalidParam(f"stop_sequences allows at most {MAX_STOP_STRINGS} strings, got "
                               f"{len(body.stop_sequences or ())}", "stop_sequences")
        fields.update(max_tokens=body.max_tokens, stop=body.stop_sequences, stream=body.stream,
                      temperature=body.temperature, top_p=body.top_p, top_k=body.top_k)
    return chat_request(fields)


def build_messages(body: MessagesBody, model: ModelFacts, request_id: str, split_reasoning: bool = True,
                   template_kwargs: dict[str, Any] | None = None) -> BuiltRequest:
    """The engine request of a Messages request (as :func:`build_chat`; errors name the Anthropic fields)."""
    return build_chat_as(_PARAMS, chat_body(body), model, request_id, split_reasoning, template_kwargs)


def count_tokens(body: CountTokensBody, model: ModelFacts, template_kwargs: dict[str, Any] | None = None) -> int:
    """The prompt tokens ``body`` renders to (``/v1/messages/count_tokens``' ``input_tokens``)."""
    return len(prompt_ids(chat_prompt(chat_body(body), model, template_kwargs), model, "messages"))
