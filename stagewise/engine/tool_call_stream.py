"""ToolCallStream: splits streamed output text into content deltas and OpenAI tool-call deltas as it arrives.

The streaming counterpart of :func:`stagewise.engine.tool_calls.parse_tool_calls`, same two formats:

* ``"hermes"``: text outside ``<tool_call>…</tool_call>`` blocks streams as content (a possible
  start of ``<tool_call>`` and trailing whitespace are held back until decided); inside a block,
  ``{"name": …, "arguments": {…}}`` becomes a first delta with the call's id and name as soon as
  the name is complete, then the raw text of the arguments object in pieces as it arrives.
* ``"llama3"``: output whose first non-blank character is ``{`` (or text after ``<|python_tag|>``)
  is one or more ``{"name": …, "parameters": {…}}`` separated by ``;``, streamed the same way.

Arguments stream as the model wrote them (a JSON object; whitespace may differ from the
non-streamed form, which re-serializes it). A call whose keys come in another order, or whose
arguments are a serialized string, is sent whole when its block ends; a block that is not a call
at all is sent as content. What was streamed is never taken back: a call cut off mid-arguments
(``max_tokens``) keeps the arguments sent so far.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

from stagewise.engine.tool_calls import (
    XML_PARAMETER,
    ToolCallFormat,
    ToolParams,
    call_from_json,
    call_from_xml,
    new_call_id,
    xml_argument,
)

_OPEN, _CLOSE, _PYTHON_TAG = "<tool_call>", "</tool_call>", "<|python_tag|>"
_PARAMETER_END = "</parameter>"
_ARGUMENT_KEYS = {"hermes": ("arguments",), "llama3": ("parameters", "arguments")}


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of tool call ``index``: its first delta has ``id`` and ``name``; later ones only ``arguments``."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, object]:
        """``{"index", "id", "type", "function": {"name", "arguments"}}`` (first) or ``{"index", "function":
        {"arguments"}}`` (later), as OpenAI streams ``delta.tool_calls`` entries."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


Delta = str | ToolCallDelta  # a str is content


class _Undecided(Exception):
    """The text so far is a prefix of what is looked for: wait for more."""


class _NotAHeader(Exception):
    """The text cannot be a call header in the expected key order."""


class _Cursor:
    """Matches the JSON call header ``{"name": "…", "<arguments key>":`` against text that may still grow."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def blank(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        if self.pos == len(self.text):
            raise _Undecided

    def literal(self, *options: str) -> str:
        self.blank()
        rest = self.text[self.pos:]
        for option in options:
            if rest.startswith(option):
                self.pos += len(option)
                return option
        if any(option.startswith(rest) for option in options):
            raise _Undecided
        raise _NotAHeader

    def string(self) -> str:
        self.blank()
        if self.text[self.pos] != '"':
            raise _NotAHeader
        end, escaped = self.pos + 1, False
        while end < len(self.text):
            char = self.text[end]
            if char == '"' and not escaped:
                value = json.loads(self.text[self.pos : end + 1])
                self.pos = end + 1
                return str(value)
            escaped = char == "\\" and not escaped
            end += 1
        raise _Undecided


def _header(body: str, keys: tuple[str, ...]) -> tuple[str, int]:
    """``(name, where the arguments value starts)``; raises :class:`_Undecided` or :class:`_NotAHeader`."""
    cursor = _Cursor(body)
    cursor.literal("{")
    cursor.literal('"name"')
    cursor.literal(":")
    name = cursor.string()
    cursor.literal(",")
    cursor.literal(*(f'"{key}"' for key in keys))
    cursor.literal(":")
    if not name:
        raise _NotAHeader
    cursor.blank()
    return name, cursor.pos


class _Call:
    """One call object being streamed: header, then the arguments value scanned to its end."""

    def __init__(self, index: int, fmt: ToolCallFormat, call_id: str) -> None:
        self.index, self.fmt, self.id = index, fmt, call_id
        self.args_start: int | None = None  # set once the header was sent
        self.scanned = self.sent = 0  # positions in the body: how far scanned, how far sent
        self.depth, self.in_string, self.escaped = 0, False, False
        self.args_end: int | None = None  # one past the arguments object's closing brace
        self.whole = False  # not streamable piecewise: sent whole at the end

    def feed(self, body: str) -> list[ToolCallDelta]:
        """Deltas for ``body`` (this call's text so far, cumulative)."""
        if self.whole:
            return []
        out: list[ToolCallDelta] = []
        if self.args_start is None:
            try:
                name, self.args_start = _header(body, _ARGUMENT_KEYS[self.fmt])
            except _Undecided:
                return []
            except _NotAHeader:
                self.whole = True
                return []
            if body[self.args_start] != "{":
                self.whole = True  # e.g. arguments serialized as a string: normalized at the end
            out.append(ToolCallDelta(self.index, "", self.id, name))
            if self.whole:
                return out
            self.scanned = self.sent = self.args_start
        self._scan(body)
        end = self.args_end if self.args_end is not None else len(body)
        if end > self.sent:
            out.append(ToolCallDelta(self.index, body[self.sent : end]))
            self.sent = end
        return out

    def _scan(self, body: str) -> None:
        while self.args_end is None and self.scanned < len(body):
            char = body[self.scanned]
            self.scanned += 1
            if self.in_string:
                if char == '"' and not self.escaped:
                    self.in_string = False
                self.escaped = char == "\\" and not self.escaped
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.args_end = self.scanned

    @property
    def header_sent(self) -> bool:
        return self.args_start is not None

    def finish(self, body: str) -> list[ToolCallDelta] | None:
        """At the end of the call's text: what could not be streamed; None when it was no call at all."""
        key = _ARGUMENT_KEYS[self.fmt][0]
        parsed = call_from_json(body.strip(), key)
        if not self.header_sent:
            if parsed is None:
                return None
            return [ToolCallDelta(self.index, parsed[1], self.id, parsed[0])]
        if self.whole and parsed is not None:
            return [ToolCallDelta(self.index, parsed[1])]
        return []


class _XmlCall:
    """One ``qwen_xml`` call being streamed: its header when ``<function=NAME>`` is complete, then the
    arguments object a parameter at a time as each ``</parameter>`` arrives (``{"k": v`` / ``, "k": v``, then
    ``}`` at the end), so the pieces join into what :func:`call_from_xml` makes of the whole block."""

    def __init__(self, index: int, call_id: str, params: ToolParams) -> None:
        self.index, self.id, self.params = index, call_id, params
        self.name: str | None = None
        self.sent = 0  # parameters sent
        self.scanned = 0  # the body before this holds no parameter not yet sent
        self.look_from = 0  # where the next "</parameter>" may start: the text before was searched already

    @property
    def header_sent(self) -> bool:
        return self.name is not None

    def feed(self, body: str) -> list[ToolCallDelta]:
        out: list[ToolCallDelta] = []
        if self.name is None:
            stripped = body.lstrip()
            if not stripped.startswith("<function=") or ">" not in stripped:
                return []  # undecided, or no call: decided at the end
            name = stripped[len("<function="):stripped.index(">")].strip()
            if not name or "\n" in name:
                return []
            self.name = name
            out.append(ToolCallDelta(self.index, "", self.id, name))
        schemas = self.params.get(self.name, {})
        for key, value in self._completed(body):
            pair = f"{json.dumps(key.strip(), ensure_ascii=False)}: " \
                   f"{json.dumps(xml_argument(value, schemas.get(key.strip())), ensure_ascii=False)}"
            out.append(ToolCallDelta(self.index, ("{" if self.sent == 0 else ", ") + pair))
            self.sent += 1
        return out

    def _completed(self, body: str) -> Iterator[tuple[str, str]]:
        """The ``(key, value)`` parameters completed since the last call, as ``XML_PARAMETER.findall`` over the
        whole body lists them; each closing tag is searched for once, not the whole body at every piece."""
        while (end := body.find(_PARAMETER_END, self.look_from)) >= 0:
            self.look_from = end + len(_PARAMETER_END)
            found = XML_PARAMETER.search(body, self.scanned, self.look_from)
            if found is not None:  # None: a closing tag no parameter opened
                self.scanned = found.end()
                yield found.group(1), found.group(2)
        self.look_from = max(self.look_from, len(body) - len(_PARAMETER_END) + 1)

    def finish(self, body: str) -> list[ToolCallDelta] | None:
        if self.name is None:
            parsed = call_from_xml(body, self.params)
            return None if parsed is None else [ToolCallDelta(self.index, parsed[1], self.id, parsed[0])]
        out = self.feed(body)
        out.append(ToolCallDelta(self.index, "}" if self.sent else "{}"))
        return out


class ToolCallStream:
    """Feed output text with :meth:`push`; get content strings and :class:`ToolCallDelta` s back.

    ``calls`` counts the calls started; the finish reason is ``tool_calls`` when it is > 0.
    """

    def __init__(self, fmt: ToolCallFormat, rng: random.Random | None = None, params: ToolParams | None = None) -> None:
        """``params``: the offered tools' parameter schemas (how ``qwen_xml`` values are read)."""
        self.fmt = fmt
        self.rng = rng or random.Random()
        self.params = params or {}
        self.calls = 0
        self._pending = ""  # text not yet decided on
        self._call: _Call | _XmlCall | None = None
        self._body = ""  # the current call's text
        self._expect_call = fmt == "llama3"  # llama3: at the start, or after a call: a "{" starts a call
        self._gap = ""  # hermes: blanks before <tool_call>, sent only if the block is no call

    def push(self, text: str) -> list[Delta]:
        """Deltas that ``text`` (the next piece of output) completes."""
        self._pending += text
        return self._drain(final=False)

    def finish(self) -> list[Delta]:
        """Deltas for whatever was held back, at the end of the output."""
        out = self._drain(final=True)
        if self._call is not None:
            self._end_call(out, self._body, closed=False)
        if self._pending and not (self.calls and self._pending.isspace()):
            out.append(self._pending)
        self._pending = ""
        return [d for d in out if not (isinstance(d, str) and not d)]

    def _drain(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while True:
            if self._call is None:
                if not self._text(out, final):
                    return out
            elif not self._in_call(out):
                return out

    def _start_call(self) -> None:
        call_id = new_call_id(self.rng)
        self._call = (_XmlCall(self.calls, call_id, self.params) if self.fmt == "qwen_xml"
                      else _Call(self.calls, self.fmt, call_id))
        self._body = ""

    def _add(self, out: list[Delta], deltas: list[ToolCallDelta]) -> None:
        self.calls += sum(d.id is not None for d in deltas)
        out += deltas

    def _end_call(self, out: list[Delta], body: str, closed: bool) -> None:
        """The current call's text ended: send the rest of it, or the text as content if it was no call."""
        assert self._call is not None
        deltas = self._call.finish(body)
        self._call = None
        if deltas is not None:
            self._add(out, deltas)
        elif self.fmt != "llama3":  # a <tool_call> block that is no call: its text
            out.append(self._gap + _OPEN + body + (_CLOSE if closed else ""))
        else:
            out.append(body)
        self._gap = ""

    def _text(self, out: list[Delta], final: bool) -> bool:
        """Outside a call: send content, or enter a call; True when there is more to process."""
        marker = _PYTHON_TAG if self.fmt == "llama3" else _OPEN
        if self._expect_call:
            stripped = self._pending.lstrip(" \t\r\n;" if self.calls else " \t\r\n")
            if not stripped:
                return False
            self._expect_call = False
            if stripped.startswith("{"):
                self._pending = stripped
                self._start_call()
                return True
        found = self._pending.find(marker)
        if found >= 0:
            content = self._pending[:found]
            if self.fmt != "llama3":
                self._gap = content[len(content.rstrip()):]
                content = content.rstrip()
            out.append(content)
            self._pending = self._pending[found + len(marker) :]
            self._start_call()
            return True
        if final:
            return False
        keep = _held_back(self._pending, marker)
        out.append(self._pending[: len(self._pending) - keep])
        self._pending = self._pending[len(self._pending) - keep :]
        return False

    def _in_call(self, out: list[Delta]) -> bool:
        """Inside a call: stream it; at its end, go back to text (or the next call); True to go on."""
        call = self._call
        assert call is not None
        if self.fmt != "llama3":  # <tool_call> blocks
            self._body += self._pending
            self._pending = ""
            closed = self._body.find(_CLOSE)
            body = self._body if closed < 0 else self._body[:closed]
            self._add(out, call.feed(body))
            if closed < 0:
                return False
            self._pending = self._body[closed + len(_CLOSE) :]
            self._end_call(out, body, closed=True)
            return True
        assert isinstance(call, _Call)  # llama3
        self._body += self._pending
        self._pending = ""
        self._add(out, call.feed(self._body))
        end = _object_end(self._body, call)
        if end is None:
            return False
        self._pending = self._body[end:]
        self._end_call(out, self._body[:end], closed=True)
        self._expect_call = True
        return bool(self._pending)


def _object_end(body: str, call: _Call) -> int | None:
    """llama3: one past the call object's closing brace, once the arguments ended (None: not yet)."""
    if call.args_end is None:
        if call.whole:  # not streamed: find the object's end by decoding
            try:
                _, end = json.JSONDecoder().raw_decode(body.lstrip())
            except json.JSONDecodeError:
                return None
            return end + len(body) - len(body.lstrip())
        return None
    after = body[call.args_end :]
    closing = after.find("}")
    if closing < 0 or after[:closing].strip():
        return None
    return call.args_end + closing + 1


def _held_back(text: str, marker: str) -> int:
    """How many trailing characters to hold: a possible start of ``marker``, and the whitespace before it."""
    keep = 0
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            keep = size
            break
    head = text[: len(text) - keep]
    return keep + len(head) - len(head.rstrip())
