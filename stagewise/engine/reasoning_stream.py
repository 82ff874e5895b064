"""ReasoningStream: splits a thinking model's output into its reasoning and its answer as the text arrives.

Models whose chat template writes ``<think>…</think>`` blocks (Qwen3, Qwen3.5/3.6, DeepSeek-R1 and their
distillations) reason first, then answer. As llama-server's default ``--reasoning-format`` and vLLM's
reasoning parsers do, the server returns the block's text apart (``reasoning_content``) and only the rest
as ``content``. Two ways a block starts:

* the output opens it: ``<think>`` before any other non-blank text (Qwen3's hybrid templates);
* the prompt opened it: the rendered prompt ends with ``<think>`` (templates that append ``<think>\\n`` to
  the generation prompt, as Qwen3.5/3.6's, DeepSeek-R1's and the 2507 thinking models' do), so the output
  starts as reasoning and ``</think>`` ends it (:func:`starts_in_reasoning`).

A block is taken once; after ``</think>`` everything is answer. Blank text around the tags is dropped
(the reasoning's leading and trailing blanks, the answer's leading blanks). A possible start of a tag
is held back until decided, so what was streamed is never taken back; the non-streamed split is the
same stream fed at once (:func:`split_reasoning`), so both forms give the same texts.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN_TAG, CLOSE_TAG = "<think>", "</think>"
REASONING_FORMATS = ("auto", "none")  # llama-server's --reasoning-format names (serve and chat): split, or not


def has_reasoning_tags(template_source: str) -> bool:
    """Whether a chat template writes ``<think>`` blocks (the model it belongs to reasons before answering)."""
    return OPEN_TAG in template_source and CLOSE_TAG in template_source


def starts_in_reasoning(prompt_text: str) -> bool:
    """Whether ``prompt_text`` (a rendered chat prompt) ends by opening a ``<think>`` block, as templates that
    open it for the model write their generation prompt (``…assistant\n<think>\n``). Only the end is read: a
    ``<think>`` a user wrote earlier in the conversation opens nothing."""
    return prompt_text.rstrip().endswith(OPEN_TAG)


@dataclass(frozen=True)
class ReasoningPiece:
    """A piece of output text: reasoning (inside the block) or answer."""

    text: str
    reasoning: bool


def _held_prefix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag`` (0 if none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningStream:
    """Feed output text with :meth:`push`, end with :meth:`finish`; each returns the pieces decided so far,
    reasoning pieces before answer pieces."""

    def __init__(self, in_reasoning: bool) -> None:
        """``in_reasoning``: the prompt opened the block (:func:`starts_in_reasoning`)."""
        self._state = "reasoning" if in_reasoning else "start"  # start → reasoning → answer, or start → answer
        self._held = ""  # text not yet decided: a possible tag start, blanks that may end the reasoning
        self._blank_skipped = False  # the leading blanks of the current part are dropped
        self.opened = in_reasoning  # a block was opened (by the prompt or the output)

    def push(self, text: str) -> list[ReasoningPiece]:
        """The pieces of ``text`` (after what was held) that are decided now."""
        out: list[ReasoningPiece] = []
        rest = self._held + text
        self._held = ""
        while rest:
            if self._state == "start":
                stripped = rest.lstrip()
                if stripped.startswith(OPEN_TAG):
                    self._state, self._blank_skipped, self.opened = "reasoning", False, True
                    rest = stripped[len(OPEN_TAG):]
                elif not stripped or OPEN_TAG.startswith(stripped):
                    self._held = rest  # blanks, or a start of the tag: undecided
                    return out
                else:
                    self._state, self._blank_skipped = "answer", True  # no block: the answer as written
            elif self._state == "reasoning":
                if not self._blank_skipped:
                    rest = rest.lstrip()
                    self._blank_skipped = bool(rest)
                    if not rest:
                        return out
                end = rest.find(CLOSE_TAG)
                if end >= 0:
                    self._emit(out, rest[:end].rstrip(), True)
                    self._state, self._blank_skipped = "answer", False
                    rest = rest[end + len(CLOSE_TAG):]
                    continue
                keep = _held_prefix(rest, CLOSE_TAG)
                decided = rest[: len(rest) - keep]
                body = decided.rstrip()  # trailing blanks wait: they are dropped if the block ends next
                self._held = decided[len(body):] + rest[len(rest) - keep:]
                self._emit(out, body, True)
                return out
            else:
                if not self._blank_skipped:
                    rest = rest.lstrip()
                    self._blank_skipped = bool(rest)
                self._emit(out, rest, False)
                return out
        return out

    def finish(self) -> list[ReasoningPiece]:
        """The pieces still held when the output ends (an unfinished block's held blanks are dropped)."""
        held, self._held = self._held, ""
        if not held:
            return []
        if self._state == "reasoning":  # blanks and a start of the closing tag the block never got
            return [ReasoningPiece(held.rstrip(), True)] if held.strip() else []
        return [ReasoningPiece(held, False)]  # before any block: the answer as written

    @staticmethod
    def _emit(out: list[ReasoningPiece], text: str, reasoning: bool) -> None:
        if text:
            out.append(ReasoningPiece(text, reasoning))


def split_reasoning(text: str, in_reasoning: bool) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a whole output (reasoning None when there was no block)."""
    stream = ReasoningStream(in_reasoning)
    pieces = stream.push(text) + stream.finish()
    reasoning = "".join(p.text for p in pieces if p.reasoning)
    answer = "".join(p.text for p in pieces if not p.reasoning)
    return (reasoning if stream.opened else None), answer
