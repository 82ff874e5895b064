"""Parse a model's finished output text into OpenAI ``tool_calls``.

Three formats:

* ``"hermes"`` (Qwen2.5/Qwen3, Hermes, :data:`~stagewise.weights.chatml_template.DEFAULT_CHATML`): one
  or more ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks; text outside
  the blocks is the message content. A final block cut off before ``</tool_call>`` still counts.
* ``"llama3"`` (Llama 3.1/3.2 JSON tool calling): the whole output is ``{"name": ..., "parameters":
  {...}}`` (``"arguments"`` accepted too), optionally after ``<|python_tag|>``, several separated by
  ``;``. Text before ``<|python_tag|>`` is content. Built-in tool calls (``brave_search.call(...)``)
  are not JSON and stay content.
* ``"qwen_xml"`` (Qwen3-Coder, Qwen3.5/3.6): ``<tool_call>`` blocks as hermes, each holding
  ``<function=NAME>`` then ``<parameter=KEY>\\nVALUE\\n</parameter>`` pairs and ``</function>``; a value is
  read as its parameter's schema type says (a string as written; numbers, booleans, objects and arrays as
  JSON), as JSON when the tool gives no type and it parses, else as a string.

Anything malformed (bad JSON, missing name, non-object arguments) leaves the whole text as content
with no calls: parsing never raises.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

ToolCallFormat = Literal["hermes", "llama3", "qwen_xml"]
ToolParams = dict[str, dict[str, Any]]  # function name -> its parameters' JSON schemas (``properties``)

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
    """Guess the format a template teaches: Qwen's XML markers → ``"qwen_xml"``, Llama 3's → ``"llama3"``,
    else ``"hermes"``."""
    if chat_template and "<function=" in chat_template and "<parameter=" in chat_template:
        return "qwen_xml"
    if chat_template and ("<|python_tag|>" in chat_template or '"parameters": ' in chat_template):
        if "<tool_call>" not in chat_template:
            return "llama3"
    return "hermes"


def tool_params(tools: list[dict[str, Any]] | None) -> ToolParams:
    """The parameters' schemas of OpenAI ``tools`` (what ``qwen_xml`` values are read by)."""
    out: ToolParams = {}
    for tool in tools or ():
        function = tool.get("function") or {}
        properties = (function.get("parameters") or {}).get("properties")
        out[str(function.get("name"))] = properties if isinstance(properties, dict) else {}
    return out


def parse_tool_calls(text: str, fmt: ToolCallFormat, rng: random.Random, params: ToolParams | None = None
                     ) -> ParsedToolCalls:
    """Split ``text`` into content and tool calls in format ``fmt``; ids come from ``rng``; ``params``: the
    offered tools' parameter schemas (``qwen_xml`` values)."""
    if fmt == "llama3":
        found = _parse_llama3(text)
    else:
        found = _parse_blocks(text, lambda body: call_from_json(body.strip(), "arguments") if fmt == "hermes"
                              else call_from_xml(body, params or {}))
    if found is None:
        return ParsedToolCalls(content=text or None, calls=())
    content, raw_calls = found
    calls = tuple(ToolCall(id=new_call_id(rng), name=name, arguments_json=args) for name, args in raw_calls)
    return ParsedToolCalls(content=content.strip() or None, calls=calls)


def _parse_blocks(text: str, read: Callable[[str], tuple[str, str] | None]) -> tuple[str, list[tuple[str, str]]] | None:
    """``<tool_call>`` blocks (hermes, qwen_xml), each body ``read`` into a call."""
    blocks = list(_HERMES_BLOCK.finditer(text))
    if not blocks:
        return None
    calls = []
    for block in blocks:
        call = read(block.group(1))
        if call is None:
            return None
        calls.append(call)
    content = _HERMES_BLOCK.sub("", text)
    return content, calls


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)(?:</function>\s*|\Z)", re.DOTALL)
XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def call_from_xml(body: str, params: ToolParams) -> tuple[str, str] | None:
    """``(name, arguments as a JSON object string)`` of a ``qwen_xml`` block's body, or None if it is not one."""
    found = _XML_FUNCTION.fullmatch(body)
    if found is None:
        return None
    name = found.group(1).strip()
    schemas = params.get(name, {})
    arguments = {key.strip(): xml_argument(value, schemas.get(key.strip()))
                 for key, value in XML_PARAMETER.findall(found.group(2))}
    return (name, json.dumps(arguments, ensure_ascii=False)) if name else None


def xml_argument(value: str, schema: Any) -> Any:
    """A ``<parameter>`` value (one newline either side dropped) as its ``schema``'s type reads it."""
    value = value.removeprefix("\n").removesuffix("\n")
    kind = schema.get("type") if isinstance(schema, dict) else None
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if kind == "string" or (isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum)):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return value
    if kind == "integer" and isinstance(parsed, float) and parsed.is_integer():
        return int(parsed)
    return parsed


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
