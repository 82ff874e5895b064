"""A small byte-level BPE tokenizer trained on a built-in corpus, for demo and test models.

:func:`train_demo_tokenizer` is deterministic: the same arguments give a byte-identical
tokenizer.json on every run and machine. Its layout (ids ascending):

* the special tokens given (default ChatML: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``);
* the 256 byte-alphabet tokens, then learned merges, up to ``vocab_size`` (the ~2.7 KB corpus runs
  out of merges at about 1,100 ids; read ``get_vocab_size(with_added_tokens=True)`` for the real size);
* the plain (non-special) added tokens ``<tool_call>`` and ``</tool_call>``;
* with ``pad_to`` set, ``<|extra_0|>``, ``<|extra_1|>``, … ordinary tokens until the size equals
  ``pad_to`` exactly, so a model whose ``vocab_size`` exceeds the tokenizer's has a token that
  streams text for every row of its embedding.

:func:`export_for_gguf` and :func:`save_for_hf` write the same tokenizer in both formats; loading
either through `stagewise.engine.tokenizer.Tokenizer` (or transformers) encodes identically.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, decoders, pre_tokenizers, trainers
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

from stagewise.errors import ConfigError
from stagewise.weights.tokenizer_gguf import (
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_UNUSED,
    TOKEN_TYPE_USER_DEFINED,
    pre_tokenizer_for,
)

CHATML_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_CALL_TOKENS = ("<tool_call>", "</tool_call>")

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Pipelines split a model into stages; each stage owns one device and runs a contiguous range of blocks.
When the user asks a question, the assistant answers clearly and briefly, and it says when it does not know.
In 2024, there were 365 days, 12 months and 52 weeks; 3.14159 is close to pi, and 2.71828 is close to e.
Hello, world! How are you today? I'm fine, thanks. You're welcome. We've seen it, they'll see it, she'd agree.
Tokens are pieces of text: words, sub-words, digits, punctuation, spaces and newlines.
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(f"{i}: {fibonacci(i)}")

class Stage:
    def __init__(self, device: str, first_block: int, last_block: int) -> None:
        self.device = device
        self.blocks = list(range(first_block, last_block))

import json
data = json.loads('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}')
if data["name"] == "get_weather" and data.get("arguments"):
    print(data["arguments"]["city"])
{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}
const add = (a, b) => a + b; let total = 0; for (const x of [1, 2, 3]) { total += x; }
SELECT id, name FROM users WHERE age >= 18 ORDER BY name ASC LIMIT 100;
<tool_call> and </tool_call> wrap a call; <tool_response> and </tool_response> wrap its result.
Ünïcödé text: café, naïve, résumé, Zürich, São Paulo, Kraków, Ελληνικά, русский язык, עברית, العربية.
日本語のテキスト、中文文本，한국어 텍스트. Emoji: 🙂 🚀 🎉 ❤️ 👍🏽 and symbols: → ← ≤ ≥ ≠ ∞ € £ ¥ © ™ °C.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 4096 65536 3.5 -7 1e-5 0x1F 1,000,000.
    Indented line with tabs\tand\tspaces   and   runs   of   spaces.
<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
The capital of France is Paris. It is known for the Eiffel Tower, the Louvre and its cafés.<|im_end|>
#include <stdio.h>
int main(void) { for (int i = 0; i < 3; ++i) { printf("%d\n", i); } return 0; }
fn main() { let v: Vec<u32> = (1..=5).map(|x| x * x).collect(); println!("{:?}", v); }
$ pip install --upgrade stagewise && stagewise serve --model ./models/demo --port 8000
Die Würde des Menschen ist unantastbar. La vie est belle. El niño juega en el jardín. Ça va très bien.
Line one.
Line two.

Paragraph after a blank line. The end.
"""


def train_demo_tokenizer(
    vocab_size: int,
    special_tokens: Sequence[str] = CHATML_SPECIAL_TOKENS,
    pad_to: int | None = None,
) -> BackendTokenizer:
    """Train the demo byte-level BPE tokenizer (Qwen2-style split regex, no normalizer).

    Args:
        vocab_size: target size of specials + byte alphabet + merges (at least ``len(special_tokens) + 256``).
        special_tokens: special tokens, given ids ``0..len-1`` in order.
        pad_to: if set, append ``<|extra_N|>`` ordinary tokens until the total size is exactly this.
    Returns:
        A `tokenizers.Tokenizer`; deterministic for equal arguments.
    Raises:
        ConfigError: ``vocab_size`` too small for the alphabet, or ``pad_to`` below the trained size.
    """
    minimum = len(special_tokens) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < minimum:
        raise ConfigError(f"demo tokenizer vocab_size {vocab_size} is below the byte alphabet + specials ({minimum})")
    tok = BackendTokenizer(BPE(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizer_for("qwen2")  # the GGUF export names it "qwen2": both must agree
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=[AddedToken(t, normalized=False, special=True) for t in special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TOOL_CALL_TOKENS])
    return tok if pad_to is None else pad_vocab(tok, pad_to)


def pad_vocab(tok: BackendTokenizer, vocab_size: int) -> BackendTokenizer:
    """``tok`` with ordinary tokens ``<|extra_0|>``, ``<|extra_1|>``, … appended up to exactly ``vocab_size`` ids.

    They are vocabulary entries no merge produces (normal tokens in a GGUF, not added ones): a model that
    samples one streams its text, as every id of a random model should (an unnamed or special id would
    stream nothing). Added tokens keep their ids; the model's vocabulary then covers every id once.
    """
    size = tok.get_vocab_size(with_added_tokens=True)
    if vocab_size < size:
        raise ConfigError(f"cannot pad a tokenizer of {size} tokens down to vocab_size {vocab_size}")
    if vocab_size == size:
        return tok
    body = json.loads(tok.to_str())
    vocab: dict[str, int] = body["model"]["vocab"]
    for added in body["added_tokens"]:  # NOTE: an added token missing from the model's vocabulary would
        vocab.setdefault(added["content"], added["id"])  # get a new id past the extras on loading
    vocab.update({f"<|extra_{n}|>": size + n for n in range(vocab_size - size)})
    return BackendTokenizer.from_str(json.dumps(body))


def export_for_gguf(
    tok: BackendTokenizer,
    chat_template: str | None = None,
    eos_token: str = "<|im_end|>",
    bos_token: str = "<|endoftext|>",
    pad_token: str = "<|endoftext|>",
    vocab_size: int = 0,
) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` (and ``tokenizer.chat_template``) GGUF fields describing ``tok``.

    Token types: special added tokens → 3 (control), other added tokens → 4 (user-defined), the
    rest → 1 (normal). ``add_bos_token`` is False, as for Qwen2 GGUFs. Ids from the tokenizer's
    size up to ``vocab_size`` (the embedding's rows) are listed as ``[PAD<id>]`` of type 5
    (unused), as llama.cpp's converter writes them: llama.cpp refuses a token list shorter than
    the embedding.
    """
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ConfigError("tokenizer ids are not contiguous from 0; cannot export GGUF tokens")
    added = tok.get_added_tokens_decoder()
    types = [TOKEN_TYPE_NORMAL] * len(tokens)
    for index, token in added.items():
        types[index] = TOKEN_TYPE_CONTROL if token.special else TOKEN_TYPE_USER_DEFINED
    for index in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{index}]")
        types.append(TOKEN_TYPE_UNUSED)
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    fields: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": _id_of(vocab, bos_token),
        "tokenizer.ggml.eos_token_id": _id_of(vocab, eos_token),
        "tokenizer.ggml.padding_token_id": _id_of(vocab, pad_token),
        "tokenizer.ggml.add_bos_token": False,
    }
    if chat_template is not None:
        fields["tokenizer.chat_template"] = chat_template
    return fields


def save_for_hf(
    tok: BackendTokenizer,
    directory: str | Path,
    chat_template: str | None,
    eos_token: str = "<|im_end|>",
    pad_token: str = "<|endoftext|>",
) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (loadable by `AutoTokenizer.from_pretrained`)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    vocab = tok.get_vocab(with_added_tokens=True)
    _id_of(vocab, eos_token)
    _id_of(vocab, pad_token)
    tok.save(str(root / "tokenizer.json"))
    config: dict[str, Any] = {
        # NOTE: the generic class loads tokenizer.json as-is; "Qwen2Tokenizer" would rebuild the
        # pipeline (adding an NFC normalizer that the GGUF form does not have).
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": eos_token,
        "pad_token": pad_token,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", "utf-8")


def _id_of(vocab: dict[str, int], token: str) -> int:
    if token not in vocab:
        raise ConfigError(f"token {token!r} is not in the tokenizer's vocabulary")
    return vocab[token]
