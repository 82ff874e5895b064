"""Build a `tokenizers.Tokenizer` from the `tokenizer.ggml.*` metadata of a GGUF file.

A GGUF carries no tokenizer.json: it stores the vocabulary, merges, token types and special ids
under llama.cpp's key names. This module converts them once, at the edge, into a byte-level BPE
`tokenizers.Tokenizer` that encodes like llama.cpp and like transformers' GGUF converter:

* ``tokenizer.ggml.model == "gpt2"`` → byte-level BPE, no normalizer, ByteLevel decoder;
* ``tokenizer.ggml.pre`` picks the split regex, llama.cpp's exact pattern for the value
  (``qwen2`` family, ``qwen35``, ``llama-bpe`` / ``llama3`` family, ``gpt-2``); a missing or
  ``default`` value gets llama.cpp's default passes. Any other value is refused
  (:class:`UnsupportedArchitecture` naming it), as llama.cpp refuses it: a guessed regex would
  tokenize differently from the model's training without a word;
* token type 3 (control) → special added token, 4 (user-defined) → plain added token;
* ``tokenizer.ggml.add_bos_token`` → a post-processor that prepends BOS when special tokens are added;
* the ids that end generation: the metadata's and the vocabulary's, as llama.cpp's ``special_eog_ids``.

SentencePiece vocabularies (``"llama"``) go through :mod:`stagewise.weights.tokenizer_spm`; other
models raise :class:`UnsupportedArchitecture`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

from stagewise.errors import CorruptModelFile, UnsupportedArchitecture
from stagewise.weights.end_of_generation import end_of_generation_ids
from stagewise.weights.tokenizer_spm import sentencepiece_backend

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_SPLIT = (  # qwen2's with combining marks (\p{M}) kept with their letters
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT: these splits, each applied to the pieces of the one before
DEFAULT_SPLITS = (
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` values (llama.cpp's names) → split regex.
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    "qwen2": QWEN2_SPLIT,
    "qwen35": QWEN35_SPLIT,
    "gpt-2": GPT2_SPLIT,
    "deepseek-r1-qwen": QWEN2_SPLIT,
    "megrez": QWEN2_SPLIT,
    "llama-bpe": LLAMA3_SPLIT,
    "llama3": LLAMA3_SPLIT,
    "llama-v3": LLAMA3_SPLIT,
    "smaug-bpe": LLAMA3_SPLIT,
    "dbrx": LLAMA3_SPLIT,
    "falcon3": LLAMA3_SPLIT,
}

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5

_BYTE_ALPHABET = frozenset(pre_tokenizers.ByteLevel.alphabet())


@dataclass(frozen=True)
class GgufTokenizer:
    """A converted GGUF tokenizer and the special-token facts read beside it.

    ``eos_token_ids`` holds every id that ends generation, as llama.cpp's set: the ``eos``, ``eot`` and
    ``eom`` ids and the vocabulary's end-of-generation tokens (:mod:`stagewise.weights.end_of_generation`);
    ``eos_token_id`` is the one a chat template writes as ``eos_token``.
    """

    backend: BackendTokenizer
    bos_token_id: int | None
    eos_token_id: int | None
    eos_token_ids: frozenset[int]
    pad_token_id: int | None
    add_bos_token: bool
    chat_template: str | None


def tokenizer_from_gguf_fields(fields: dict[str, Any]) -> GgufTokenizer:
    """Convert GGUF metadata (key → plain python value) into a :class:`GgufTokenizer`.

    Raises:
        UnsupportedArchitecture: ``tokenizer.ggml.model`` is neither ``"gpt2"`` (byte-level BPE) nor
            ``"llama"`` (SentencePiece), or ``tokenizer.ggml.pre`` is unknown.
        CorruptModelFile: a required field is missing, or a field is inconsistent (named in the message).
    """
    model = _required(fields, "tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise UnsupportedArchitecture(
            f"GGUF tokenizer.ggml.model {model!r} is not supported ('gpt2' byte-level BPE, 'llama' SentencePiece)"
        )
    tokens = _typed_list(fields, "tokenizer.ggml.tokens", str)
    token_types = (_typed_list(fields, "tokenizer.ggml.token_type", int) if "tokenizer.ggml.token_type" in fields
                   else [TOKEN_TYPE_NORMAL] * len(tokens))
    if len(token_types) != len(tokens):
        raise CorruptModelFile(
            f"GGUF field tokenizer.ggml.token_type has {len(token_types)} entries for {len(tokens)} tokens"
        )
    if model == "llama":
        scores = [float(s) for s in _typed_list(fields, "tokenizer.ggml.scores", float)]
        add_prefix = fields.get("tokenizer.ggml.add_space_prefix", True)
        backend = sentencepiece_backend(tokens, scores, token_types, bool(add_prefix))
        add_bos_default = True  # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
    else:
        backend = _byte_level_backend(fields, tokens, token_types)
        add_bos_default = False
    return _finish(fields, backend, tokens, add_bos_default)


def _byte_level_backend(fields: dict[str, Any], tokens: list[str], token_types: list[int]) -> BackendTokenizer:
    merges = [_split_merge(m) for m in _typed_list(fields, "tokenizer.ggml.merges", str)]
    # NOTE: llama.cpp stores some tokens in plain UTF-8 rather than the byte alphabet. Normal ones are
    # respelled for the BPE model; user-defined ones keep their text, which is what gets matched.
    vocab = {
        token if kind == TOKEN_TYPE_USER_DEFINED else _byte_spelling(token): index
        for index, (token, kind) in enumerate(zip(tokens, token_types, strict=True))
    }
    try:
        model_bpe = BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False)
    except Exception as exc:  # tokenizers raises a bare Exception for a merge of unknown tokens
        raise CorruptModelFile(f"GGUF field tokenizer.ggml.merges is inconsistent with the tokens ({exc})") from None
    backend = BackendTokenizer(model_bpe)
    backend.pre_tokenizer = pre_tokenizer_for(fields.get("tokenizer.ggml.pre"))
    backend.decoder = decoders.ByteLevel()
    _add_typed_tokens(backend, tokens, token_types)
    return backend


def _finish(fields: dict[str, Any], backend: BackendTokenizer, tokens: list[str], add_bos_default: bool) -> GgufTokenizer:
    bos = _optional_id(fields, "tokenizer.ggml.bos_token_id", len(tokens))
    eos = _optional_id(fields, "tokenizer.ggml.eos_token_id", len(tokens))
    named = [_optional_id(fields, f"tokenizer.ggml.{name}_token_id", len(tokens)) for name in ("eot", "eom")]
    fim = [_optional_id(fields, f"tokenizer.ggml.fim_{name}_token_id", len(tokens)) for name in ("pad", "rep", "sep")]
    eos_ids = end_of_generation_ids(tokens, [eos, *named], fim)
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", add_bos_default)) and bos is not None
    if add_bos and bos is not None:
        bos_text = tokens[bos]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos_text}:0 $A:0", pair=f"{bos_text}:0 $A:0 {bos_text}:1 $B:1", special_tokens=[(bos_text, bos)]
        )
    template = fields.get("tokenizer.chat_template")
    return GgufTokenizer(
        backend=backend,
        bos_token_id=bos,
        eos_token_id=eos,
        eos_token_ids=eos_ids,
        pad_token_id=_optional_id(fields, "tokenizer.ggml.padding_token_id", len(tokens)),
        add_bos_token=add_bos,
        chat_template=str(template) if template else None,
    )


def pre_tokenizer_for(pre: object) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer of GGUF ``tokenizer.ggml.pre`` (llama.cpp's regexes; see the module docstring).

    Raises:
        UnsupportedArchitecture: a value llama.cpp's names do not map to a regex we hold.
    """
    if pre is None or pre == "default":
        splits: tuple[str, ...] = DEFAULT_SPLITS
    elif isinstance(pre, str) and pre in PRE_TOKENIZER_SPLITS:
        splits = (PRE_TOKENIZER_SPLITS[pre],)
    else:
        raise UnsupportedArchitecture(
            f"GGUF tokenizer.ggml.pre {pre!r} is not supported "
            f"(supported: default, {', '.join(sorted(PRE_TOKENIZER_SPLITS))})"
        )
    return pre_tokenizers.Sequence(
        [
            *(pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False) for split in splits),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _add_typed_tokens(backend: BackendTokenizer, tokens: list[str], token_types: list[int]) -> None:
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel; adding it would
    # grow the vocabulary past the model's, so it is skipped (as transformers does).
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, token_types, strict=True)
        if kind == TOKEN_TYPE_CONTROL and set(token) <= _BYTE_ALPHABET
    ]
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, token_types, strict=True)
        if kind == TOKEN_TYPE_USER_DEFINED
    ]
    if control:
        backend.add_special_tokens(control)
    if user_defined:
        backend.add_tokens(user_defined)


def _byte_spelling(token: str) -> str:
    if set(token) <= _BYTE_ALPHABET:
        return token
    return "".join(_BYTE_SPELLING[b] for b in token.encode("utf-8"))


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte → printable character map.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


_BYTE_SPELLING = _bytes_to_unicode()  # built once: every token outside the alphabet uses it


def _split_merge(merge: str) -> tuple[str, str]:
    left, sep, right = merge.partition(" ")
    if not sep or not left or not right or " " in right:
        raise CorruptModelFile(f"GGUF field tokenizer.ggml.merges holds a malformed merge {merge!r}")
    return left, right


def _required(fields: dict[str, Any], key: str) -> Any:
    if fields.get(key) is None:
        raise CorruptModelFile(f"GGUF field {key} is missing")
    return fields[key]


def _typed_list(fields: dict[str, Any], key: str, kind: type) -> list[Any]:
    values = list(_required_list(fields, key))
    if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
        raise CorruptModelFile(f"GGUF field {key} must be an array of {kind.__name__}")
    return values


def _required_list(fields: dict[str, Any], key: str) -> Sequence[Any]:
    value = _required(fields, key)
    if isinstance(value, str | bytes | dict) or not hasattr(value, "__iter__"):  # list, tuple, ndarray
        raise CorruptModelFile(f"GGUF field {key} is not an array")
    return list(value)


def _optional_id(fields: dict[str, Any], key: str, vocab_size: int) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise CorruptModelFile(f"GGUF field {key} must be an integer, got {value!r}")
    index = value
    if not 0 <= index < vocab_size:
        raise CorruptModelFile(f"GGUF field {key} = {index} is outside the vocabulary of {vocab_size} tokens")
    return index
