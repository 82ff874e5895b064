"""ToolCallStream: streamed content and tool-call deltas agree with the non-streamed parse, however the text is cut."""

from __future__ import annotations

import json
import random

import pytest

from stagewise.engine.tool_call_stream import Delta, ToolCallDelta, ToolCallStream
from stagewise.engine.tool_calls import ToolCallFormat, parse_tool_calls

HERMES = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "n": [1, {"x": "}"}]}}\n</tool_call>'
TWO = HERMES + '\n<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>'
LLAMA = ' {"name": "f", "parameters": {"a": "x\\"}"}}; {"name": "g", "parameters": {}}'
XML = ("I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, <b>France</b>\n</parameter>\n"
       "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
XML_TWO = XML + "\n<tool_call>\n<function=now>\n</function>\n</tool_call>"


def _stream(text: str, fmt: ToolCallFormat, cuts: list[int]) -> list[Delta]:
    stream = ToolCallStream(fmt, random.Random(0))
    out: list[Delta] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(text)], strict=True):
        out += stream.push(text[lo:hi])
    return out + stream.finish()


def _assembled(deltas: list[Delta]) -> tuple[str, list[tuple[str, str]]]:
    content = "".join(d for d in deltas if isinstance(d, str))
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if isinstance(d, ToolCallDelta):
            if d.id is not None:
                assert d.index == len(calls) and d.id.startswith("call_") and d.name
                calls[d.index] = [d.name, ""]
            calls[d.index][1] += d.arguments
    return content, [(name, args) for name, args in calls.values()]


@pytest.mark.parametrize(("text", "fmt"), [(HERMES, "hermes"), (TWO, "hermes"), (LLAMA, "llama3"),
                                           ("no call here <tool", "hermes"), ("x <tool_call>{bad}</tool_call> y", "hermes"),
                                           ('<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>', "hermes"),
                                           ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', "hermes"),
                                           ("Hello {not json", "llama3"), (XML, "qwen_xml"), (XML_TWO, "qwen_xml"),
                                           (XML[:-40], "qwen_xml"), ("a <tool_call>\nnot xml\n</tool_call> b", "qwen_xml")])
@pytest.mark.parametrize("seed", range(6))
def test_any_cut_matches_the_whole_parse(text: str, fmt: ToolCallFormat, seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if seed else list(
        range(1, len(text)))  # seed 0: one character at a time
    content, calls = _assembled(_stream(text, fmt, cuts))
    whole = parse_tool_calls(text, fmt, random.Random(0))
    assert [(n, json.loads(a)) for n, a in calls] == [(c.name, json.loads(c.arguments_json)) for c in whole.calls]
    assert (content.strip() or None) == (whole.content.strip() if whole.content else None)


def test_arguments_stream_in_pieces_after_the_name() -> None:
    deltas = _stream(HERMES, "hermes", list(range(1, len(HERMES))))
    first_call = next(i for i, d in enumerate(deltas) if isinstance(d, ToolCallDelta))
    assert "".join(d for d in deltas[:first_call] if isinstance(d, str)) == "Let me check."
    header = deltas[first_call]
    assert isinstance(header, ToolCallDelta) and header.name == "get_weather" and header.arguments == ""
    pieces = [d for d in deltas[first_call + 1 :] if isinstance(d, ToolCallDelta)]
    assert len(pieces) > 5 and all(p.id is None and p.index == 0 for p in pieces)
    assert header.to_openai() == {"index": 0, "id": header.id, "type": "function",
                                  "function": {"name": "get_weather", "arguments": ""}}
    assert pieces[0].to_openai() == {"index": 0, "function": {"arguments": pieces[0].arguments}}
    assert not any(isinstance(d, str) and "tool_call" in d for d in deltas)


def test_cut_off_call_keeps_what_was_sent() -> None:
    stream = ToolCallStream("hermes", random.Random(0))
    deltas = stream.push('<tool_call>\n{"name": "f", "arguments": {"a": 1') + stream.finish()
    assert stream.calls == 1
    assert "".join(d.arguments for d in deltas if isinstance(d, ToolCallDelta)) == '{"a": 1'



_VALUE_PIECES = ["x", "1", "\n", "[2]", "</parame", "ter", "<b>", "</param", " "]


def _xml_block(rng: random.Random) -> str:
    params = "".join(f"<parameter={rng.choice('abc')}>\n{''.join(rng.choice(_VALUE_PIECES) for _ in range(rng.randint(0, 6)))}"
                     "\n</parameter>\n" for _ in range(rng.randint(0, 4)))
    return f"<tool_call>\n<function={rng.choice(['f', 'get'])}>\n{params}</function>\n</tool_call>"


@pytest.mark.parametrize("seed", range(40))
def test_xml_parameters_stream_as_the_whole_parse_reads_them(seed: int) -> None:
    rng = random.Random(seed)
    text = rng.choice(["", "Let me see. "]) + "\n".join(_xml_block(rng) for _ in range(rng.randint(1, 3)))
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 40))))
    content, calls = _assembled(_stream(text, "qwen_xml", cuts))
    whole = parse_tool_calls(text, "qwen_xml", random.Random(0))
    assert [(n, json.loads(a)) for n, a in calls] == [(c.name, json.loads(c.arguments_json)) for c in whole.calls]
    assert (content.strip() or None) == whole.content
