"""Tool-call parsing on scripted model outputs."""

from __future__ import annotations

import json
import random
import re

import pytest

from stagewise.engine.tool_calls import (
    ParsedToolCalls,
    ToolCall,
    detect_tool_call_format,
    new_call_id,
    parse_tool_calls,
)
from stagewise.weights.chatml_template import DEFAULT_CHATML


def rng() -> random.Random:
    return random.Random(1234)


def test_ids_are_deterministic_and_shaped() -> None:
    a, b = new_call_id(rng()), new_call_id(rng())
    assert a == b
    assert re.fullmatch(r"call_[0-9a-f]{24}", a)


def test_hermes_single_call() -> None:
    out = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
    parsed = parse_tool_calls(out, "hermes", rng())
    assert parsed.content is None
    assert [(c.name, json.loads(c.arguments_json)) for c in parsed.calls] == [("get_weather", {"city": "Zürich"})]
    assert parsed.calls[0].id == new_call_id(rng())
    assert "Zürich" in parsed.calls[0].arguments_json  # not \\u-escaped


def test_hermes_several_calls_with_content_and_unclosed_tail() -> None:
    out = (
        'I will check both.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": "{\\"x\\": 1}"}\n</tool_call>\n'
        '<tool_call>\n{"name": "c", "arguments": {"y": [1, 2]}}'
    )
    parsed = parse_tool_calls(out, "hermes", rng())
    assert parsed.content == "I will check both."
    assert [c.name for c in parsed.calls] == ["a", "b", "c"]
    assert [json.loads(c.arguments_json) for c in parsed.calls] == [{}, {"x": 1}, {"y": [1, 2]}]
    assert len({c.id for c in parsed.calls}) == 3


@pytest.mark.parametrize(
    "out",
    [
        "Just an answer, no tools.",
        '<tool_call>\n{"name": "a", "arguments": {broken json}\n</tool_call>',
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "a", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n["not", "an", "object"]\n</tool_call>',
        '<tool_call>\n{"name": "ok", "arguments": {}}\n</tool_call><tool_call>{"name": 3}</tool_call>',
        "",
    ],
)
def test_hermes_malformed_is_plain_content(out: str) -> None:
    assert parse_tool_calls(out, "hermes", rng()) == ParsedToolCalls(content=out or None, calls=())


def test_llama3_json_forms() -> None:
    plain = parse_tool_calls('{"name": "get_weather", "parameters": {"city": "Paris"}}', "llama3", rng())
    assert plain.content is None
    assert [(c.name, c.arguments_json) for c in plain.calls] == [("get_weather", '{"city": "Paris"}')]
    tagged = parse_tool_calls(
        'Sure.<|python_tag|>{"name": "f", "arguments": {"a": 1}}; {"name": "g", "parameters": {}}', "llama3", rng()
    )
    assert tagged.content == "Sure."
    assert [c.name for c in tagged.calls] == ["f", "g"]


@pytest.mark.parametrize(
    "out",
    [
        "The weather is nice.",
        '{"name": "f", "parameters": {"a": 1}} and then some prose',
        '<|python_tag|>brave_search.call(query="x")',
        '{"not_a_call": true}',
        '{"name": "f", "parameters": {',
    ],
)
def test_llama3_non_calls_are_plain_content(out: str) -> None:
    assert parse_tool_calls(out, "llama3", rng()) == ParsedToolCalls(content=out, calls=())


def test_to_openai_and_validation() -> None:
    call = ToolCall(id="call_x", name="f", arguments_json="{}")
    assert call.to_openai() == {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    with pytest.raises(ValueError):
        ToolCall(id="call_x", name="", arguments_json="{}")


def test_detect_format() -> None:
    assert detect_tool_call_format(DEFAULT_CHATML) == "hermes"
    assert detect_tool_call_format(None) == "hermes"
    assert detect_tool_call_format('{"name": function name, "parameters": ...} <|python_tag|>') == "llama3"
    assert detect_tool_call_format("<tool_call>\n<function=example>\n<parameter=p>\nv\n</parameter>") == "qwen_xml"


def test_qwen_xml_values_read_by_their_schemas() -> None:
    text = ("Checking.\n<tool_call>\n<function=book>\n<parameter=zip>\n01234\n</parameter>\n<parameter=nights>\n"
            "2\n</parameter>\n<parameter=extras>\n[\"wifi\"]\n</parameter>\n<parameter=note>\nfirst line\nsecond\n"
            "</parameter>\n</function>\n</tool_call>")
    params = {"book": {"zip": {"type": "string"}, "nights": {"type": "integer"}, "extras": {"type": "array"},
                       "note": {"type": "string"}}}
    parsed = parse_tool_calls(text, "qwen_xml", random.Random(0), params)
    assert parsed.content == "Checking." and [c.name for c in parsed.calls] == ["book"]
    assert json.loads(parsed.calls[0].arguments_json) == {"zip": "01234", "nights": 2, "extras": ["wifi"],
                                                          "note": "first line\nsecond"}
    untyped = parse_tool_calls(text, "qwen_xml", random.Random(0))  # no schema: JSON where it parses
    assert json.loads(untyped.calls[0].arguments_json)["zip"] == "01234"  # not JSON (a leading zero): as written
