"""ReasoningStream: a thinking model's output split into reasoning and answer, the same however it is streamed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise.engine.reasoning_stream import (
    ReasoningStream,
    has_reasoning_tags,
    split_reasoning,
    starts_in_reasoning,
)


@pytest.mark.parametrize(("text", "in_reasoning", "expected"), [
    ("<think>\nI think.\n</think>\n\nAnswer.", False, ("I think.", "Answer.")),  # the output opens the block
    ("\n <think>a</think>b", False, ("a", "b")),  # blanks before the block
    ("I think.\n</think>\n\nAnswer.", True, ("I think.", "Answer.")),  # the prompt opened it
    ("Answer only.", False, (None, "Answer only.")),
    ("  Answer <think>x</think>", False, (None, "  Answer <think>x</think>")),  # a block after text is text
    ("<think>\n\n</think>\n\nHi", False, ("", "Hi")),  # an empty block
    ("cut off mid-thought  \n", True, ("cut off mid-thought", "")),  # max_tokens inside the block
    ("a </thin b</think>c", True, ("a </thin b", "c")),  # a start of the tag that was not one
    ("<think>x</think>y</think>", False, ("x", "y</think>")),  # one block: later tags are answer
    ("  <thi", False, (None, "  <thi")),  # an output that ended on a possible tag start: as written
])
def test_split(text: str, in_reasoning: bool, expected: tuple[str | None, str]) -> None:
    assert split_reasoning(text, in_reasoning) == expected


_FRAGMENTS = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "think>", "\n", " ", "a", "b c", "\n\n", ">"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=14), st.booleans(), st.data())
def test_any_streaming_gives_the_whole_split(fragments: list[str], in_reasoning: bool, data: st.DataObject) -> None:
    text = "".join(fragments)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    stream = ReasoningStream(in_reasoning)
    pieces = []
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        got = stream.push(text[start:end])
        # reasoning never follows answer, and nothing is empty
        pieces += got
    pieces += stream.finish()
    assert all(p.text for p in pieces)
    kinds = [p.reasoning for p in pieces]
    assert kinds == sorted(kinds, reverse=True)
    reasoning = "".join(p.text for p in pieces if p.reasoning)
    answer = "".join(p.text for p in pieces if not p.reasoning)
    assert (reasoning if stream.opened else None, answer) == split_reasoning(text, in_reasoning)
    if "<think>" not in text and "</think>" not in text and not in_reasoning and text.strip():
        assert answer == text  # no block: the answer exactly as written


def test_no_tag_text_is_held_longer_than_a_tag() -> None:
    stream = ReasoningStream(True)
    assert [p.text for p in stream.push("step one")] == ["step one"]
    assert stream.push(" </th") == []  # could be the closing tag
    assert [p.text for p in stream.push("ings")] == [" </things"]


def test_prompt_and_template_detection() -> None:
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking false
    assert not starts_in_reasoning("<|im_start|>assistant\n")
    assert not starts_in_reasoning("<|im_start|>user\nWhat does <think> mean?<|im_end|>\n<|im_start|>assistant\n")
    assert has_reasoning_tags("{% if x %}<think>{{ r }}</think>{% endif %}")
    assert not has_reasoning_tags("<|im_start|>{{ m }}<|im_end|>")
