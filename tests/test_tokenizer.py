"""Tokenizer.from_dir against transformers' AutoTokenizer on directories the tests write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import processors

from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import ConfigError, CorruptModelFile, ModelNotFound
from stagewise.weights.tokenizer_train import save_for_hf, train_demo_tokenizer

LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]
TEXTS = [
    "Hello world",
    "  two leading spaces, trailing   ",
    "numbers 1234567890 and 3.14",
    "line\nbreaks\r\n\n\ttab",
    "é日本🙂👍🏽 Zürich ελληνικά",
    "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<|im_start|>x<|im_end|>",
]


def _write_llama_dir(root: Path, config: dict[str, object], with_processor: bool = True) -> None:
    tok = train_demo_tokenizer(600, special_tokens=LLAMA_SPECIALS)
    if with_processor:
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|>:0 $A:0",
            pair="<|begin_of_text|>:0 $A:0 <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", 0)],
        )
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llama")
    _write_llama_dir(
        root,
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": {"__type": "AddedToken", "content": "<|eot_id|>", "special": True},
            "chat_template": "from-config",
        },
    )
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 4, 5]}))
    return root


def test_encode_matches_auto_tokenizer(llama_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(llama_dir))
    ours = Tokenizer.from_dir(llama_dir)
    for text in TEXTS:
        for add in (False, True):
            assert ours.encode(text, add_special_tokens=add) == hf.encode(text, add_special_tokens=add), (text, add)
        ids = ours.encode(text)
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == text


def test_special_ids(llama_dir: Path) -> None:
    tok = Tokenizer.from_dir(llama_dir)
    assert tok.bos_token_id == 0
    assert tok.eos_token_id == 4
    assert tok.eos_token_ids == {1, 4, 5}
    assert tok.pad_token_id is None
    assert tok.special_tokens_map == {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    assert tok.special_token_ids["<|python_tag|>"] == 6
    assert tok.vocab_size == 600 + 2  # trained vocab + <tool_call>, </tool_call>
    assert tok.chat_template == "from-config"


def test_jinja_file_overrides_config(tmp_path: Path) -> None:
    _write_llama_dir(
        tmp_path, {"chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "B"}]}
    )
    assert Tokenizer.from_dir(tmp_path).chat_template == "A"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert Tokenizer.from_dir(tmp_path).chat_template == "J"


def test_post_processor_not_config_flag_decides_bos(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    # transformers v5 ignores add_bos_token for tokenizer.json tokenizers; so do we.
    _write_llama_dir(tmp_path, {"bos_token": "<|begin_of_text|>", "add_bos_token": True}, with_processor=False)
    ours = Tokenizer.from_dir(tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert ours.encode("hi there", add_special_tokens=True) == hf.encode("hi there")


def test_config_added_tokens_are_added(tmp_path: Path) -> None:
    _write_llama_dir(tmp_path, {"added_tokens_decoder": {"602": {"content": "<|new|>", "special": True}}})
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.encode("a<|new|>") == [*tok.encode("a"), 602]


def test_demo_tokenizer_round_trip_through_hf_files(tmp_path: Path) -> None:
    save_for_hf(train_demo_tokenizer(500), tmp_path, chat_template="T", eos_token="<|im_end|>")
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.eos_token_ids == {2}
    assert tok.pad_token_id == 0
    assert tok.bos_token_id is None
    assert tok.chat_template == "T"


def test_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match=r"tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CorruptModelFile, match=r"tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)
    _write_llama_dir(tmp_path, {})
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(ConfigError, match=r"generation_config\.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "generation_config.json").write_text("[")
    with pytest.raises(CorruptModelFile, match=r"generation_config\.json"):
        Tokenizer.from_dir(tmp_path)
