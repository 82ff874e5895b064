"""Structured output: OpenAI's ``response_format`` and a forced ``tool_choice`` as a :class:`Grammar`.

* ``{"type": "json_object"}``: one JSON object; ``{"type": "json_schema", "json_schema": {"schema":
  {...}}}``: one JSON value valid under the schema (llguidance's JSON-schema support; an
  unsupported keyword is a 400 naming ``response_format``).
* ``tool_choice: "required"`` or ``{"type": "function", "function": {"name": N}}``: the output is one
  call, in the format the chat template teaches (Hermes ``<tool_call>\\n{...}\\n</tool_call>`` or
  Llama 3 JSON), of any offered tool or of ``N``, its arguments valid under the tool's
  ``parameters`` schema; in Qwen's XML format (``<function=N>`` and ``<parameter=K>`` pairs), each value
  valid under its property's schema (a string: text without ``<``), the parameters those the tool names.

JSON is written compactly (``", "`` and ``": "``, no other whitespace).
"""

from __future__ import annotations

import json
from typing import Any

from stagewise.engine.grammar import JSON_OPTIONS, Grammar
from stagewise.engine.grammar_vocabulary import GrammarVocabulary
from stagewise.engine.schema_finiteness import check_finite
from stagewise.engine.tokenizer import Tokenizer
from stagewise.engine.tool_calls import ToolCallFormat
from stagewise.errors import GrammarError
from stagewise.server.model_facts import ModelFacts
from stagewise.server.openai_errors import InvalidParam

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _vocabulary(model: ModelFacts, param: str) -> GrammarVocabulary:
    if model.tokenizer is None:
        raise InvalidParam(f"model {model.name} has no tokenizer", param)
    try:
        return GrammarVocabulary.of(model.tokenizer, model.vocab_size, model.stop_token_ids)
    except GrammarError as exc:
        raise InvalidParam(str(exc), param) from exc


def response_format_grammar(response_format: dict[str, Any] | None, model: ModelFacts) -> Grammar | None:
    """The grammar ``response_format`` asks for; None for ``text`` (or none given)."""
    kind = None if response_format is None else response_format.get("type")
    if kind in (None, "text"):
        return None
    assert response_format is not None
    if kind == "json_object":
        schema: Any = _ANY_OBJECT
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidParam("response_format json_schema needs {'json_schema': {'name', 'schema'}}",
                               "response_format")
        schema = spec.get("schema", _ANY_OBJECT)
        if not isinstance(schema, dict):
            raise InvalidParam("response_format json_schema.schema must be an object", "response_format")
    else:
        raise InvalidParam(f"response_format type {kind!r} is not supported (text, json_object, json_schema)",
                           "response_format")
    try:
        return Grammar.json_schema(schema, _vocabulary(model, "response_format"), f"response_format {kind}")
    except GrammarError as exc:
        raise InvalidParam(str(exc), "response_format") from exc


def tool_choice_grammar(tool_choice: str | dict[str, Any] | None, tools: list[dict[str, Any]] | None,
                        fmt: ToolCallFormat, model: ModelFacts) -> Grammar | None:
    """The grammar of a forced ``tool_choice`` (``required`` or a named function); None for ``auto``/``none``."""
    if tool_choice in (None, "auto", "none"):
        return None
    if tool_choice == "required":
        chosen = list(tools or [])
        if not chosen:
            raise InvalidParam("tool_choice 'required' needs tools", "tool_choice")
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [t for t in tools or [] if t["function"].get("name") == name]
        if not chosen:
            raise InvalidParam(f"tool_choice names function {name!r}, which is not among the tools", "tool_choice")
    else:
        raise InvalidParam("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
                           "{'name': ...}}", "tool_choice")
    vocabulary = _vocabulary(model, "tool_choice")
    if fmt == "qwen_xml":
        return _xml_call_grammar([tool["function"] for tool in chosen], model, vocabulary)
    arguments_key = "arguments" if fmt == "hermes" else "parameters"
    calls = [_call_schema(tool["function"], arguments_key) for tool in chosen]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    try:
        if fmt == "llama3":
            return Grammar.json_schema(schema, vocabulary, "tool_choice")
        call = json.dumps({**schema, "x-guidance": JSON_OPTIONS})
        tokenizer = model.tokenizer
        assert tokenizer is not None
        start, end = (_lark_token(tokenizer, tag) for tag in ("<tool_call>", "</tool_call>"))
        return Grammar.lark(f'start: {start} "\\n" call "\\n" {end}\ncall: %json {call}', vocabulary, "tool_choice")
    except GrammarError as exc:
        raise InvalidParam(str(exc), "tool_choice") from exc


def _xml_call_grammar(functions: list[dict[str, Any]], model: ModelFacts, vocabulary: GrammarVocabulary) -> Grammar:
    """One ``qwen_xml`` call of one of ``functions``: ``<function=NAME>``, then any of its parameters, each
    ``<parameter=KEY>\\nVALUE\\n</parameter>`` with a value its schema allows."""
    tokenizer = model.tokenizer
    assert tokenizer is not None
    start, end = (_lark_token(tokenizer, tag) for tag in ("<tool_call>", "</tool_call>"))
    try:
        rules, alternatives = _xml_rules(functions)
        text = "\n".join([f'start: {start} "\\n" call "\\n" {end}', f"call: {' | '.join(alternatives)}", *rules])
        return Grammar.lark(text, vocabulary, "tool_choice")
    except GrammarError as exc:
        raise InvalidParam(str(exc), "tool_choice") from exc


def _xml_rules(functions: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The Lark rules of each function's call (``f{i}``): its parameters in the schema's order, each once, the
    required ones always (``p{i}_{j}``, values ``v{i}_{j}``)."""
    rules, alternatives = [], []
    for i, function in enumerate(functions):
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") or {}
        required = set(parameters.get("required") or ())
        body = []
        for j, (key, schema) in enumerate(properties.items()):
            schema = schema if isinstance(schema, dict) else {}
            check_finite(schema, "tool_choice")
            rules.append(f"p{i}_{j}: {json.dumps(f'<parameter={key}>' + chr(10))} v{i}_{j} "
                         f"{json.dumps(chr(10) + '</parameter>' + chr(10))}\nv{i}_{j}: {_xml_value(schema)}")
            body.append(f"p{i}_{j}" if key in required else f"p{i}_{j}?")
        rules.append(f"f{i}: {json.dumps('<function=' + str(function.get('name')) + '>' + chr(10))} "
                     f"{' '.join(body)} \"</function>\"")
        alternatives.append(f"f{i}")
    return rules, alternatives


def _xml_value(schema: dict[str, Any]) -> str:
    """A parameter value's rule: a string as written (no ``<``; at most ``maxLength``), one of a string enum,
    anything else as JSON under its schema."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return " | ".join(json.dumps(v) for v in enum)
    if schema.get("type") == "string" or not schema:
        longest = schema.get("maxLength")
        return f"/[^<]{{0,{int(longest)}}}/" if isinstance(longest, int) else "/[^<]*/"
    return f"%json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}"


def _lark_token(tokenizer: Tokenizer, text: str) -> str:
    """``text`` in Lark: by id (``<[151657]>``) when it is one token of the vocabulary, else as a string.

    NOTE: llguidance treats every added token as special; a quoted string equal to one is allowed by
    its mask and then refused when consumed, so a single-token tag must be named by id."""
    token = tokenizer.token_to_id(text)
    return f"<[{token}]>" if token is not None else json.dumps(text)


def _call_schema(function: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    """``{"name": <const>, <arguments key>: <parameters>}``, name first (streamed tool calls expect it)."""
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidParam("each tool function needs a name", "tools")
    parameters = function.get("parameters") or _ANY_OBJECT
    if not isinstance(parameters, dict):
        raise InvalidParam(f"the parameters of tool {name!r} must be a JSON schema object", "tools")
    try:
        check_finite(parameters, f"the parameters of tool {name!r}")
    except GrammarError as exc:
        raise InvalidParam(str(exc), "tools") from exc
    return {"type": "object", "properties": {"name": {"const": name}, arguments_key: parameters},
            "required": ["name", arguments_key], "additionalProperties": False}
