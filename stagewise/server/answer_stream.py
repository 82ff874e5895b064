"""AnswerStream: one choice's streamed output as typed deltas — reasoning, answer text, tool-call pieces.

What every streaming chat API (OpenAI's chunks, Anthropic's content blocks) makes of the engine's text: a
thinking model's reasoning split off first (:class:`~stagewise.engine.reasoning_stream.ReasoningStream`), then,
with tools offered, tool calls split out of the answer (:class:`~stagewise.engine.tool_call_stream.ToolCallStream`);
a forced call (``tool_choice`` required or named) cut off before its header is still a call, never raw text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from stagewise.engine.cut_off_calls import forced_deltas
from stagewise.engine.reasoning_stream import ReasoningStream
from stagewise.engine.request_output import RequestOutput
from stagewise.engine.tool_call_stream import Delta, ToolCallDelta, ToolCallStream
from stagewise.server.request_builder import BuiltRequest


@dataclass(frozen=True)
class Thought:
    """A piece of the reasoning."""

    text: str


AnswerDelta = Thought | Delta  # Delta: answer text (str) or a ToolCallDelta


class AnswerStream:
    """Feed each engine output of one choice to :meth:`push`; deltas come in output order, never empty."""

    def __init__(self, built: BuiltRequest) -> None:
        self.thinking = ReasoningStream(built.reasoning) if built.reasoning is not None else None
        self.parser = (ToolCallStream(built.tool_format, params=built.tool_params) if built.tool_format is not None
                       else None)
        self.forced = built.forced_tools
        self.written = ""  # the answer so far (a forced call's name is read from it)

    def push(self, output: RequestOutput) -> list[AnswerDelta]:
        found: list[AnswerDelta] = []
        text = output.text
        if self.thinking is not None:
            pieces = self.thinking.push(text) + (self.thinking.finish() if output.finished else [])
            if thought := "".join(p.text for p in pieces if p.reasoning):
                found.append(Thought(thought))
            text = "".join(p.text for p in pieces if not p.reasoning)
        if self.parser is None:
            return [*found, text] if text else found
        self.written += text
        deltas = self.parser.push(text)
        if output.finished:
            ending = self.parser.finish()
            if self.forced and not self.parser.calls and output.finish_reason == "length":
                ending = [d for d in ending if not isinstance(d, str)]
                ending += forced_deltas(self.written, self.forced, random.Random())
            deltas += ending
        return found + [d for d in deltas if d]

    def called(self, output: RequestOutput) -> bool:
        """Whether the finished ``output`` ends in tool calls (one cut off by ``max_tokens`` ends ``length``)."""
        return self.parser is not None and bool(self.parser.calls) and output.finish_reason != "length"


__all__ = ["AnswerDelta", "AnswerStream", "Thought", "ToolCallDelta"]
