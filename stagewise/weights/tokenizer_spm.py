"""SentencePiece vocabularies (GGUF ``tokenizer.ggml.model = "llama"``) as a `tokenizers` BPE.

llama.cpp's SPM tokenizer starts from single characters and repeatedly merges the adjacent pair
whose merged text is the highest-scoring vocabulary entry; characters with no token fall back to
their UTF-8 bytes as ``<0xNN>`` tokens. That is a BPE whose merges are every split ``a + b`` of a
vocabulary token, ranked by the token's score (as transformers' GGUF converter derives them), with
byte fallback. Spaces are spelled ``▁``; ``tokenizer.ggml.add_space_prefix`` (default true)
prepends one to each run of text, as llama.cpp does at the start and after a special token.
"""

from __future__ import annotations

import math

from tokenizers import AddedToken, decoders, normalizers
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

from stagewise.errors import CorruptModelFile

SPACE = "\u2581"  # ▁
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_BYTE = 6


def sentencepiece_backend(tokens: list[str], scores: list[float], token_types: list[int],
                          add_space_prefix: bool) -> BackendTokenizer:
    """The BPE equivalent of llama.cpp's SPM tokenizer for this vocabulary.

    Raises:
        CorruptModelFile: scores missing for some tokens, not finite, or no byte tokens to fall back on.
    """
    if len(scores) != len(tokens):
        raise CorruptModelFile(f"GGUF field tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
    if not all(math.isfinite(s) for s in scores):
        raise CorruptModelFile("GGUF field tokenizer.ggml.scores holds a value that is not finite")
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise CorruptModelFile("GGUF field tokenizer.ggml.tokens lists a token twice (a SentencePiece vocabulary cannot)")
    unknown = [t for t, kind in zip(tokens, token_types, strict=True) if kind == TOKEN_TYPE_UNKNOWN]
    model = BPE(vocab=vocab, merges=_merges(tokens, scores, token_types, vocab), dropout=None,
                unk_token=unknown[0] if unknown else None, fuse_unk=True, byte_fallback=True)
    backend = BackendTokenizer(model)
    steps = [normalizers.Prepend(SPACE)] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
    strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []
    backend.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    special = [AddedToken(t, normalized=False, special=True)
               for t, kind in zip(tokens, token_types, strict=True) if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN)]
    user = [AddedToken(t, normalized=False, special=False)
            for t, kind in zip(tokens, token_types, strict=True) if kind == TOKEN_TYPE_USER_DEFINED]
    if special:
        backend.add_special_tokens(special)
    if user:
        backend.add_tokens(user)
    return backend


def _merges(tokens: list[str], scores: list[float], token_types: list[int],
            vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a mergeable token into two tokens, best merged score first (ties: by ids)."""
    ranked: list[tuple[float, int, int, str, str]] = []
    for token, score, kind in zip(tokens, scores, token_types, strict=True):
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_BYTE):
            continue  # never formed by merging
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]
