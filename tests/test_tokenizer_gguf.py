"""GGUF tokenizer metadata → tokenizers pipeline, checked against transformers on the same vocab."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import CorruptModelFile, UnsupportedArchitecture
from stagewise.weights.tokenizer_train import export_for_gguf, save_for_hf, train_demo_tokenizer

TEXTS = [
    "Hello world",
    " leading space and  double  spaces",
    "digits 1234567 and 3.14159, 1e-5 0x1F",
    "tabs\tand\nnewlines\n\n\r\n  indented\n    code()",
    "Ünïcödé café naïve 日本語のテキスト 한국어 русский 🙂🚀👍🏽 ❤️",
    "I'm sure they'll say we've DONE it, SHE'D agree",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    "mixed<|endoftext|>special<|im_end|>tokens   ",
    "",
]


@pytest.fixture(scope="module")
def fields() -> dict[str, Any]:
    return export_for_gguf(train_demo_tokenizer(700), chat_template="{{ messages }}")


def _hf_from_gguf_converter(fields: dict[str, Any]) -> Any:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    renames = {
        "model": "tokenizer_type",
        "pre": "pre_tokenizer_type",
        "tokens": "tokens",
        "token_type": "token_type",
        "merges": "merges",
    }
    tokenizer_dict = {name: fields[f"tokenizer.ggml.{key}"] for key, name in renames.items()}
    backend, _ = convert_gguf_tokenizer("qwen2", tokenizer_dict)
    return backend


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe"])
def test_matches_transformers_gguf_converter(fields: dict[str, Any], pre: str) -> None:
    fields = {**fields, "tokenizer.ggml.pre": pre}
    ours = Tokenizer.from_gguf_fields(fields)
    theirs = _hf_from_gguf_converter(fields)
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids, text


def test_matches_hf_tokenizer_from_same_vocab(fields: dict[str, Any], tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    save_for_hf(train_demo_tokenizer(700), tmp_path, chat_template=None)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    ours = Tokenizer.from_gguf_fields(fields)
    for text in TEXTS:
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_split_regex_follows_pre(fields: dict[str, Any]) -> None:
    qwen = Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.pre": "qwen2"})
    llama = Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.pre": "llama-bpe"})
    assert len(qwen.encode("1234567")) == 7  # one digit per piece
    assert len(llama.encode("1234567")) >= 3  # up to three digits per piece


def test_special_ids_types_and_template(fields: dict[str, Any]) -> None:
    tok = Tokenizer.from_gguf_fields(fields)
    tokens = fields["tokenizer.ggml.tokens"]
    assert tok.vocab_size == len(tokens)
    assert tok.eos_token_ids == {tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")}  # as llama.cpp's EOG set
    assert tok.bos_token_id == tok.pad_token_id == tokens.index("<|endoftext|>")
    assert tok.special_tokens_map == {
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }
    assert "<|im_start|>" in tok.special_token_ids and "<tool_call>" not in tok.special_token_ids
    assert tok.encode("<tool_call>") == [tokens.index("<tool_call>")]
    assert tok.decode(tok.encode("a<tool_call>b<|im_end|>")) == "a<tool_call>b"
    assert tok.chat_template == "{{ messages }}"


def test_add_bos_and_eot(fields: dict[str, Any]) -> None:
    bos = fields["tokenizer.ggml.bos_token_id"]
    tok = Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.eot_token_id": 0})
    assert tok.encode("hi", add_special_tokens=True) == [bos, *tok.encode("hi")]
    assert 0 in tok.eos_token_ids


def test_utf8_tokens_outside_byte_alphabet_are_respelled(fields: dict[str, Any]) -> None:
    tokens = [*fields["tokenizer.ggml.tokens"], "<think> x"]
    types = [*fields["tokenizer.ggml.token_type"], 4]
    tok = Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types})
    assert tok.vocab_size == len(tokens)
    assert tok.encode("a<think> x") == [*tok.encode("a"), len(tokens) - 1]
    assert tok.decode(tok.encode("a<think> x b")) == "a<think> x b"


@pytest.mark.parametrize("key", ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"])
def test_missing_field_names_it(fields: dict[str, Any], key: str) -> None:
    broken = {k: v for k, v in fields.items() if k != key}
    with pytest.raises(CorruptModelFile, match=key):
        Tokenizer.from_gguf_fields(broken)


def test_inconsistent_fields(fields: dict[str, Any]) -> None:
    with pytest.raises(CorruptModelFile, match="token_type"):
        Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.token_type": [1, 1]})
    with pytest.raises(CorruptModelFile, match="eos_token_id"):
        Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.eos_token_id": 10**9})
    with pytest.raises(CorruptModelFile, match="merges"):
        Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.merges": ["nospace"]})


def test_other_tokenizer_models_are_unsupported(fields: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedArchitecture, match="'bert'"):
        Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.model": "bert"})
    with pytest.raises(CorruptModelFile, match=r"tokenizer\.ggml\.scores is missing"):  # SentencePiece needs scores
        Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.model": "llama"})


def test_unknown_pre_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedArchitecture, match=r"tokenizer\.ggml\.pre 'mystery-pre'"):
        Tokenizer.from_gguf_fields({**fields, "tokenizer.ggml.pre": "mystery-pre"})


def _pieces(pre: str | None, text: str) -> list[str]:
    from stagewise.weights.tokenizer_gguf import pre_tokenizer_for

    return [piece for piece, _ in pre_tokenizer_for(pre).pre_tokenize_str(text)]


def test_pre_regexes_are_llama_cpps() -> None:
    # qwen35 keeps a combining mark with its letters; qwen2 leaves it to the punctuation run
    assert _pieces("qwen35", "cafe\u0301!") == ["cafe\u00cc\u0123", "!"]  # byte-level spelling of e + U+0301
    assert _pieces("qwen2", "cafe\u0301!") == ["cafe", "\u00cc\u0123!"]
    assert len(_pieces("qwen2", "1234567")) == 7  # one digit per piece
    assert len(_pieces("llama-bpe", "1234567")) == 3  # up to three
    assert len(_pieces("gpt-2", "1234567")) == 1  # gpt-2: a whole number
    assert len(_pieces(None, "1234567")) == 3 == len(_pieces("default", "1234567"))  # default: \p{N}+ then 3 digits
    assert len(_pieces("default", "a+b")) == 3  # default: punctuation runs first


def test_vocabulary_listed_up_to_vocab_size() -> None:
    tok = train_demo_tokenizer(300)
    size = tok.get_vocab_size(with_added_tokens=True)
    fields = export_for_gguf(tok, vocab_size=size + 5)
    assert len(fields["tokenizer.ggml.tokens"]) == len(fields["tokenizer.ggml.token_type"]) == size + 5
    assert fields["tokenizer.ggml.tokens"][size:] == [f"[PAD{i}]" for i in range(size, size + 5)]
    assert fields["tokenizer.ggml.token_type"][size:] == [5] * 5  # unused, as llama.cpp's converter writes
    plain = Tokenizer.from_gguf_fields(export_for_gguf(tok))
    padded = Tokenizer.from_gguf_fields(fields)
    for text in TEXTS:
        assert padded.encode(text) == plain.encode(text), text


@pytest.fixture(scope="module")
def spm_fields() -> dict[str, Any]:
    """A SentencePiece (``tokenizer.ggml.model = llama``) vocabulary laid out as Llama 2 GGUFs are:
    <unk>, <s>, </s>, the 256 byte tokens, then pieces scored by merge order."""
    from tokenizers import SentencePieceBPETokenizer

    trainer = SentencePieceBPETokenizer()
    corpus = [t for t in TEXTS if t and "<" not in t] * 3 + ["the quick brown fox jumps over the lazy dog"] * 5
    trainer.train_from_iterator(corpus, vocab_size=400, min_frequency=1, show_progress=False)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types, scores = [2, 3, 3, *[6] * 256], [0.0] * len(tokens)
    for rank, (piece, _) in enumerate(sorted(trainer.get_vocab().items(), key=lambda kv: kv[1])):
        if piece not in tokens:
            tokens.append(piece)
            types.append(1)
            scores.append(-float(rank))
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def test_sentencepiece_matches_transformers_gguf_converter(spm_fields: dict[str, Any]) -> None:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    renames = {"model": "tokenizer_type", "tokens": "tokens", "scores": "scores", "token_type": "token_type"}
    theirs, _ = convert_gguf_tokenizer("llama", {name: spm_fields[f"tokenizer.ggml.{k}"] for k, name in renames.items()})
    ours = Tokenizer.from_gguf_fields(spm_fields)
    for text in [t for t in TEXTS if not t.startswith(" ")]:  # a leading space: see below
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_sentencepiece_as_llama_cpp(spm_fields: dict[str, Any]) -> None:
    ours = Tokenizer.from_gguf_fields(spm_fields)
    tokens = spm_fields["tokenizer.ggml.tokens"]
    pieces = [tokens[i] for i in ours.encode("fox \u017e")]  # ž is in no piece: its UTF-8 bytes
    assert pieces == ["\u2581fox", "\u2581", "<0xC5>", "<0xBE>"]
    assert ours.decode(ours.encode("fox \u017e")) == "fox \u017e"
    # llama.cpp prepends the dummy space unconditionally (transformers' Metaspace skips it here)
    assert [tokens[i] for i in ours.encode(" fox")][:2] == ["\u2581", "\u2581fox"]
    assert ours.encode("fox", add_special_tokens=True)[0] == 1  # BOS by default for SentencePiece
    no_prefix = Tokenizer.from_gguf_fields({**spm_fields, "tokenizer.ggml.add_space_prefix": False})
    assert tokens[no_prefix.encode("fox")[0]] != "\u2581fox"
