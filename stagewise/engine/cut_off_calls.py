"""Tool calls of an output cut off by ``max_tokens``: the call written so far, never raw call text.

A call cut mid-arguments keeps the arguments written so far (as the stream already sent them, see
:class:`~stagewise.engine.tool_call_stream.ToolCallStream`); the finish reason stays ``length``. A
forced ``tool_choice`` (``required`` or a named function) cut before its name was complete is still a
call, of the one function the name written so far can be, with the arguments empty: the grammar
allowed nothing else, so the text is never content.
"""

from __future__ import annotations

import random
import re

from stagewise.engine.tool_call_stream import Delta, ToolCallDelta, ToolCallStream
from stagewise.engine.tool_calls import ParsedToolCalls, ToolCall, ToolCallFormat, ToolParams, new_call_id

_NAME_SO_FAR = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)|<function=([^>\n]*)')  # JSON formats' and qwen_xml's


def forced_name(text: str, forced: tuple[str, ...]) -> str | None:
    """The one function of ``forced`` whose name starts with what ``text`` wrote of it (all of them when
    it wrote none yet); None when that is not exactly one."""
    found = _NAME_SO_FAR.search(text)
    written = (found.group(1) or found.group(2) or "") if found else ""
    candidates = [name for name in forced if name.startswith(written)]
    return candidates[0] if len(candidates) == 1 else None


def cut_off_calls(text: str, fmt: ToolCallFormat, forced: tuple[str, ...], rng: random.Random,
                  params: ToolParams | None = None) -> ParsedToolCalls:
    """Content and calls of ``text``, an output that ended at ``max_tokens`` with tools offered.

    Args:
        text: the whole output.
        fmt: the tool-call format the template teaches.
        forced: the functions a forced ``tool_choice`` allows (``()``: not forced).
        rng: draws the call ids.
        params: the offered tools' parameter schemas (``qwen_xml`` values).
    """
    stream = ToolCallStream(fmt, rng, params)
    deltas = stream.push(text) + stream.finish()
    if forced and not stream.calls:
        deltas = forced_deltas(text, forced, rng)
    return _assemble(deltas)


def forced_deltas(text: str, forced: tuple[str, ...], rng: random.Random) -> list[Delta]:
    """The call delta of a forced call cut before its header was complete (none when its function is
    not known), in place of the held-back text."""
    name = forced_name(text, forced)
    return [ToolCallDelta(0, "", new_call_id(rng), name)] if name is not None else []


def _assemble(deltas: list[Delta]) -> ParsedToolCalls:
    content: list[str] = []
    heads: dict[int, ToolCallDelta] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        if isinstance(delta, str):
            content.append(delta)
            continue
        if delta.id is not None:
            heads[delta.index] = delta
        arguments.setdefault(delta.index, []).append(delta.arguments)
    calls = tuple(ToolCall(head.id or "", head.name or "", "".join(arguments[index]))
                  for index, head in sorted(heads.items()))
    text = "".join(content).strip()
    return ParsedToolCalls(content=text or None, calls=calls)
