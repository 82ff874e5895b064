"""The API process's side of the warm-up: what a first request would otherwise build while clients wait.

The engine process warms its kernels and graphs before ready; the API process renders, tokenizes and
detokenizes, and some of that is built on first use: above all the tokenizer's byte bound
(:attr:`~stagewise.engine.tokenizer.Tokenizer.max_token_bytes`, every id's bytes: 0.67 s for a
248,320-id vocabulary on the 2-core machine), which every request's prompt check reads. Building one
text-completion and one chat request and stream-decoding a few ids, without submitting anything, pays
for all of it before the server says ready.
"""

from __future__ import annotations

from stagewise.server.model_facts import ModelFacts
from stagewise.server.openai_errors import InvalidParam
from stagewise.server.request_builder import build_chat, build_completion
from stagewise.server.schemas import ChatCompletionBody, CompletionBody

_TEXT = "Warm-up: the request path, built once before ready."


def warm_request_path(model: ModelFacts) -> str | None:
    """Build a text-completion request and a chat request for ``model`` (prompt tokenized, the tokenizer's byte
    bound computed, template rendered) and decode their prompt ids as a stream would; nothing reaches the engine.
    Returns None, or why the chat template refused a one-message conversation (the completion side is warm then;
    a chat request meets the same error, as a 400)."""
    completion = build_completion(CompletionBody.model_validate({"prompt": _TEXT, "max_tokens": 1}), model, "warm-up")
    ids = list(completion.request.prompt_ids)
    try:
        chat = ChatCompletionBody.model_validate({"messages": [{"role": "user", "content": _TEXT}], "max_tokens": 1})
        ids += build_chat(chat, model, "warm-up").request.prompt_ids
    except InvalidParam as exc:
        return f"the chat template refused a one-message conversation at warm-up: {exc}"
    finally:
        decoder = model.tokenizer.incremental_decoder()
        for token in ids:
            decoder.push(token)
        decoder.flush()
    return None
