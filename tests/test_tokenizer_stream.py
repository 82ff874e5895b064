"""IncrementalDecoder: streamed text equals the one-shot decode, with no partial characters."""

from __future__ import annotations

import pytest

from stagewise.engine.tokenizer import Tokenizer
from stagewise.weights.tokenizer_train import export_for_gguf, train_demo_tokenizer

TEXTS = [
    "Hello world, this is plain ASCII.",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Emoji 🙂🚀👍🏽❤️ and € £ ¥ © ™",
    "mixed é<|im_end|>ü<|im_start|>😀 end",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf_fields(export_for_gguf(train_demo_tokenizer(400)))


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip", [True, False])
def test_stream_equals_decode(tok: Tokenizer, text: str, skip: bool) -> None:
    ids = tok.encode(text)
    decoder = tok.incremental_decoder(skip_special_tokens=skip)
    pieces = [decoder.push(i) for i in ids]
    assert "".join(pieces) + decoder.flush() == tok.decode(ids, skip_special_tokens=skip)
    assert all("\ufffd" not in piece for piece in pieces)
    assert decoder.token_ids == ids


def test_multibyte_character_split_across_byte_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("🚀")
    assert len(ids) > 1  # a 4-byte character the small vocab cannot hold in one token
    decoder = tok.incremental_decoder()
    assert [decoder.push(i) for i in ids] == [""] * (len(ids) - 1) + ["🚀"]


def test_flush_emits_incomplete_tail(tok: Tokenizer) -> None:
    ids = tok.encode("a🚀")
    decoder = tok.incremental_decoder()
    assert decoder.push_many(ids[:-1]) == "a"
    assert decoder.flush() == tok.decode(ids[:-1])[1:]
    assert decoder.flush() == ""


def test_invalid_bytes_do_not_stall_forever(tok: Tokenizer) -> None:
    lone_continuation = tok.encode("🚀")[-1]  # a UTF-8 continuation byte on its own
    decoder = tok.incremental_decoder()
    out = decoder.push_many([lone_continuation] * 20)
    assert out  # emitted (as U+FFFD) once the hold-back limit is passed
