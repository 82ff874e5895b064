"""The demo tokenizer trainer: determinism, layout, padding, GGUF export."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stagewise.errors import ConfigError
from stagewise.weights.tokenizer_gguf import TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED
from stagewise.weights.tokenizer_train import export_for_gguf, pad_vocab, train_demo_tokenizer

_HASH_SCRIPT = (
    "import hashlib; from stagewise.weights.tokenizer_train import train_demo_tokenizer as t; "
    "print(hashlib.sha256(t(512).to_str().encode()).hexdigest())"
)


def test_deterministic_across_processes() -> None:
    digests = {
        subprocess.run([sys.executable, "-c", _HASH_SCRIPT], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert len(digests) == 1
    assert train_demo_tokenizer(512).to_str() == train_demo_tokenizer(512).to_str()


def test_layout() -> None:
    tok = train_demo_tokenizer(512)
    vocab = tok.get_vocab(with_added_tokens=True)
    assert [vocab[t] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert vocab["<tool_call>"] == 512 and vocab["</tool_call>"] == 513
    assert tok.get_vocab_size(with_added_tokens=True) == 514
    added = tok.get_added_tokens_decoder()
    assert added[2].special and not added[512].special


def test_pad_to_model_vocab() -> None:
    tok = train_demo_tokenizer(400, pad_to=1024)
    assert tok.get_vocab_size(with_added_tokens=True) == 1024
    assert tok.token_to_id("<|extra_0|>") == 402
    with pytest.raises(ConfigError, match="pad"):
        pad_vocab(tok, 10)


def test_vocab_size_below_alphabet_is_rejected() -> None:
    with pytest.raises(ConfigError, match="vocab_size"):
        train_demo_tokenizer(100)


def test_export_for_gguf_fields() -> None:
    fields = export_for_gguf(train_demo_tokenizer(400, pad_to=410), chat_template="T")
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 410
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "qwen2"
    assert types[0] == TOKEN_TYPE_CONTROL and types[3] == TOKEN_TYPE_NORMAL
    assert types[tokens.index("<tool_call>")] == TOKEN_TYPE_USER_DEFINED
    assert types[-1] == TOKEN_TYPE_NORMAL and tokens[-1] == "<|extra_7|>"  # ordinary: it streams its text
    assert len(fields["tokenizer.ggml.merges"]) == 400 - 3 - 256
    assert all(m.count(" ") == 1 for m in fields["tokenizer.ggml.merges"])
    assert (
        fields["tokenizer.ggml.bos_token_id"],
        fields["tokenizer.ggml.eos_token_id"],
        fields["tokenizer.ggml.padding_token_id"],
    ) == (0, 2, 0)
    assert fields["tokenizer.chat_template"] == "T"
