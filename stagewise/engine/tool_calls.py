"""Parse a model's finished output text into OpenAI ``tool_calls``.

Two formats:

* ``"hermes"`` (Qwen2.5/Qwen3, Hermes, :data:`~stagewise.weights.chatml_template.DEFAULT_CHATML`): one
  or more ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks; text outside
  the blocks is the message content. A final block cut off before ``</tool_call>`` still counts.
* ``"llama3"`` (Llama 3.1/3.2 JSON tool calling): the whole output is ``{"name": ..., "parameters":
  {...}}`` (``"arguments"`` accepted too), optionally after ``<|python_tag|>``, several separated by
  ``;``. Text before ``<|python_tag|>`` is content. Built-in tool calls (``brave_search.call(...)``)
  are not JSON and stay content.

Anything malformed (bad JSON, missing name, non-object arguments) leaves the whole text as content
with no calls: parsing never raises.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

ToolCallFormat = Literal["hermes", "llama3"]

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    """One function call. ``arguments_json`` is a JSON object serialized as a string (OpenAI's form)."""

    id: str
    name: str
    arguments_json: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("tool call name must not be empty")

    def to_openai(self) -> dict[str, Any]:
        """``{"id", "type": "function", "function": {"name", "arguments"}}`` as the Chat Completions API sends it."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True)
class ParsedToolCalls:
    """Content (None when empty) and the calls found, in output order."""

    content: str | None
    calls: tuple[ToolCall, ...]


def new_call_id(rng: random.Random) -> str:
    """``call_`` + 24 lowercase hex digits drawn from ``rng`` (deterministic for a seeded rng)."""
    return f"call_{rng.getrandbits(96):024x}"


def detect_tool_call_format(chat_template: str | None) -> ToolCallFormat:
    """Guess the format a template teaches: Llama 3 markers → ``"llama3"``, else ``"hermes"``."""
    if chat_template and ("<|python_tag|>" in chat_template or '"parameters": ' in chat_template):
        if "<tool_call>" not in chat_template:
            return "llama3"
    return "hermes"


def parse_tool_calls(text: str, fmt: ToolCallFormat, rng: random.Random) -> ParsedToolCalls:
    """Split ``text`` into content and tool calls in format ``fmt``; ids come from ``rng``."""
    found = _parse_hermes(text) if fmt == "hermes" else _parse_llama3(text)
    if found is None:
        return ParsedToolCalls(content=text or None, calls=())
    content, raw_calls = found
    calls = tuple(ToolCall(id=new_call_id(rng), name=name, arguments_json=args) for name, args in raw_calls)
    return ParsedToolCalls(content=content.strip() or None, calls=calls)


def _parse_hermes(text: str) -> tuple[str, list[tuple[str, str]]] | None:
    blocks = list(_HERMES_BLOCK.finditer(text))
    if not blocks:
        return None
    calls = []
    for block in blocks:
        call = call_from_json(block.group(1).strip(), "arguments")
        if call is None:
            return None
        calls.append(call)
    content = _HERMES_BLOCK.sub("", text)
    return content, calls


def _parse_llama3(text: str) -> tuple[str, list[tuple[str, str]]] | None:
    content, tag, rest = text.partition(_PYTHON_TAG)
    if not tag:
        content, rest = "", text
    rest = rest.strip()
    if not rest.startswith("{"):
        return None
    calls = []
    position = 0
    while position < len(rest):
        try:
            value, end = _JSON.raw_decode(rest, position)
        except json.JSONDecodeError:
            return None
        call = _call_from_value(value, "parameters")
        if call is None:
            return None
        calls.append(call)
        position = _skip_separator(rest, end)
    return content, calls


def _skip_separator(text: str, position: int) -> int:
    while position < len(text) and (text[position].isspace() or text[position] == ";"):
        position += 1
    return position


def call_from_json(body: str, arguments_key: str) -> tuple[str, str] | None:
    """``(name, arguments as a JSON object string)`` of one call object's text, or None if it is not one."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    return _call_from_value(value, arguments_key)


def _call_from_value(value: Any, arguments_key: str) -> tuple[str, str] | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    if isinstance(arguments, str):  # some models emit the arguments already serialized
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)
