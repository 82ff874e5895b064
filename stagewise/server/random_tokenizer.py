"""A tokenizer for ``random:PRESET`` models, which come without one: the demo BPE with the ChatML template.

The weights are random, so the text is nonsense; what it buys is that ``serve random:PRESET`` answers
chat and text requests end to end (load tests, API checks) like a real model. Every id up to the model's
vocabulary is named (``<|extra_N|>`` past the trained ones), so each sampled token streams text and a
client's time to first token is the first token's; ``<|im_end|>`` and ``<|endoftext|>`` end a generation,
as they do in a ``make-model`` file.
"""

from __future__ import annotations

import dataclasses

from stagewise.engine.chat_template import ChatTemplate
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import ConfigError
from stagewise.weights.chatml_template import DEFAULT_CHATML

DEMO_TOKENIZER_MAX = 1024  # trained vocabulary at most (the built-in corpus runs out of merges past it)


def with_demo_tokenizer(model: LoadedModel) -> LoadedModel:
    """``model`` with the demo tokenizer (trained for at most ``min(vocab_size, 1024)`` ids, padded to
    ``vocab_size``) and ChatML.

    Raises :class:`ConfigError` when the model's vocabulary is below the demo tokenizer's minimum."""
    from stagewise.weights.end_of_generation import end_of_generation_ids
    from stagewise.weights.tokenizer_train import TOOL_CALL_TOKENS, pad_vocab, train_demo_tokenizer

    vocab_size = model.config.vocab_size
    backend = train_demo_tokenizer(min(vocab_size, DEMO_TOKENIZER_MAX) - len(TOOL_CALL_TOKENS))
    size = backend.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise ConfigError(f"{model.name}: vocab_size {vocab_size} is below the demo tokenizer's {size} tokens")
    backend = pad_vocab(backend, vocab_size)
    vocab = backend.get_vocab(with_added_tokens=True)
    eos = vocab["<|im_end|>"]
    ends = end_of_generation_ids(sorted(vocab, key=vocab.__getitem__), [eos])
    tokenizer = Tokenizer(backend, eos_token_id=eos, eos_token_ids=ends, pad_token_id=vocab["<|endoftext|>"],
                          chat_template=DEFAULT_CHATML)
    return dataclasses.replace(model, tokenizer=tokenizer, chat_template=ChatTemplate(DEFAULT_CHATML))
