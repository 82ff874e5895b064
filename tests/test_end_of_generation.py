"""Generation stops on every end-of-generation token: the GGUF's metadata and vocabulary (llama.cpp's set),
an HF directory's generation_config.json, the random: tokenizer; ``finish_reason: stop`` over HTTP."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI
from starlette.testclient import TestClient

from stagewise.engine.engine import Engine
from stagewise.engine.model_loading import load_model
from stagewise.engine.tokenizer import Tokenizer
from stagewise.server.app import guarded_app
from stagewise.server.engine_front import LocalEngine
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from stagewise.weights.end_of_generation import end_of_generation_ids
from stagewise.weights.gguf_source import GGUFSource
from stagewise.weights.make_model import make_model
from stagewise.weights.preset_configs import load_hf_config

VOCAB = 1100
QWEN3_ENDS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
              "<think>", "hello"]


def test_vocabulary_texts_and_named_ids_end_generation() -> None:
    # Qwen3's: the text's end, the turn's end, and llama.cpp's FIM pad / repo / file-separator tokens
    assert end_of_generation_ids(QWEN3_ENDS, [2]) == {0, 2, 3, 4, 5}
    # Llama 3.1's three, and a metadata id with an ordinary text
    llama = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "x", "y"]
    assert end_of_generation_ids(llama, [4, None]) == {1, 2, 3, 4}
    # FIM ids named by the metadata win over the texts; out-of-range names are ignored
    assert end_of_generation_ids(["a", "<|fim_pad|>", "b"], [7], (2, None, None)) == {2}


def test_llama_cpp_exceptions() -> None:
    harmony = ["<|end|>", "<|return|>", "<|call|>", "<|start|>"]  # gpt-oss: <|end|> ends a message, not the turn
    assert end_of_generation_ids(harmony) == {1, 2}
    assert end_of_generation_ids(["<|end|>", "a"]) == {0}
    assert end_of_generation_ids(["</s>", "<|tool_response>"]) == {1}  # gemma4: </s> is ordinary there
    assert end_of_generation_ids(["</s>", "<unk>"]) == {0}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eog")
    config = {**load_hf_config("tiny-qwen3"), "vocab_size": VOCAB}  # past the trained 1,024: <|extra_N|> rows
    return {"gguf": make_model(config, root / "m.gguf", "gguf", "f32", seed=1),
            "safetensors": make_model(config, root / "st", "safetensors", "f32", seed=1)}


def test_make_model_files_name_every_id_and_end_on_both(made: dict[str, Path]) -> None:
    fields = GGUFSource(made["gguf"]).fields
    vocab_size = len(fields["tokenizer.ggml.tokens"])
    from_gguf = Tokenizer.from_gguf_fields(fields)
    from_dir = Tokenizer.from_dir(made["safetensors"])
    for tok in (from_gguf, from_dir):
        ends = {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
        assert tok.eos_token_ids == ends and tok.eos_token_id == tok.token_to_id("<|im_end|>")
        assert tok.vocab_size == vocab_size
        last = tok.decode([vocab_size - 1])
        assert last.startswith("<|extra_") and last.endswith("|>")  # an ordinary token: it streams its text
    assert set(fields["tokenizer.ggml.token_type"][-5:]) == {1}  # normal, as llama.cpp should read them


def _server(path: Path) -> Iterator[tuple[OpenAI, str]]:
    loaded = load_model(str(path), None, "single", 128)
    engine = Engine(loaded, max_waiting=4).start()
    state = ServerState(ServeSettings())
    assert state.set_ready(LocalEngine(loaded, engine))
    try:
        with TestClient(guarded_app(state), base_url="http://testserver") as http:
            yield OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0), loaded.name
    finally:
        engine.stop()
        loaded.close()


@pytest.mark.parametrize("fmt", ["gguf", "safetensors"])
@pytest.mark.parametrize("stream", [False, True])
def test_end_of_text_token_stops_with_finish_reason_stop(made: dict[str, Path], fmt: str, stream: bool) -> None:
    tok = Tokenizer.from_dir(made["safetensors"])
    for client, name in _server(made[fmt]):
        for end in ("<|endoftext|>", "<|im_end|>"):
            bias = {str(tok.token_to_id(end)): 100}  # the model's first token is that end
            kw = dict(model=name, prompt="Hello", max_tokens=8, logit_bias=bias, temperature=0)
            if stream:
                chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
                reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
                text = "".join(c.choices[0].text for c in chunks if c.choices)
                usage = chunks[-1].usage
            else:
                reply = client.completions.create(**kw)
                reasons, text, usage = [reply.choices[0].finish_reason], reply.choices[0].text, reply.usage
            assert reasons == ["stop"] and text == ""
            assert usage is not None and usage.completion_tokens == 1
        # ignore_eos (vLLM's and llama-server's field): generation runs to max_tokens
        reply = client.completions.create(extra_body={"ignore_eos": True}, **kw)
        assert reply.choices[0].finish_reason == "length" and reply.usage and reply.usage.completion_tokens == 8


def test_random_preset_tokenizer_names_every_id_and_ends_on_both() -> None:
    from stagewise.server.random_tokenizer import with_demo_tokenizer

    loaded = load_model("random:tiny-qwen3", None, "single", 64)
    try:  # the tokenizer follows the config's vocabulary (the weights' rows are not read)
        model = with_demo_tokenizer(dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, vocab_size=VOCAB)))
        tok = model.tokenizer
        assert tok is not None and tok.vocab_size == model.config.vocab_size
        assert {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")} <= model.stop_token_ids
        assert tok.decode([model.config.vocab_size - 1]).startswith("<|extra_")
    finally:
        loaded.close()
