"""``POST /tokenize`` and ``POST /detokenize``, as llama.cpp's and vLLM's servers answer them."""

from __future__ import annotations

from typing import Any

from stagewise.server.model_facts import ModelFacts
from stagewise.server.openai_errors import InvalidParam
from stagewise.server.request_builder import prompt_ids, render_chat, template_variables
from stagewise.server.schemas import DetokenizeBody, TokenizeBody


def tokenize(body: TokenizeBody, model: ModelFacts, template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"tokens", "count", "max_model_len"}`` for exactly one of ``content`` / ``prompt`` (text, special
    tokens only where written: ``add_special`` / ``add_special_tokens`` adds BOS and the like, default off,
    as completions encode prompts) or ``messages`` (rendered through the chat template, as chat does, with
    the server's ``template_kwargs`` under the body's ``chat_template_kwargs``)."""
    given = [name for name in ("content", "prompt", "messages") if getattr(body, name) is not None]
    if len(given) != 1:
        raise InvalidParam("give exactly one of content, prompt or messages", given[1] if given else "content")
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise InvalidParam(f"model {model.name} has no tokenizer")
    if body.messages is not None:
        variables = template_variables(template_kwargs, body.chat_template_kwargs)
        rendered = render_chat(body.messages, model, add_generation_prompt=body.add_generation_prompt,
                               variables=variables)
        ids = prompt_ids(rendered, model, "messages")
    else:
        text = body.content if body.content is not None else body.prompt
        assert text is not None
        add_special = bool(body.add_special if body.add_special is not None else body.add_special_tokens)
        ids = tokenizer.encode(text, add_special_tokens=add_special)
    return {"tokens": ids, "count": len(ids), "max_model_len": model.max_context}


def detokenize(body: DetokenizeBody, model: ModelFacts) -> dict[str, Any]:
    """``{"content"}`` (llama.cpp's key; also as ``prompt``, vLLM's): the text of ``tokens``, special tokens
    written out. Ids outside the model's vocabulary are a 400 naming ``tokens``."""
    vocab = model.vocab_size
    bad = next((i for i, t in enumerate(body.tokens) if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidParam(f"token id {body.tokens[bad]} is outside the vocabulary [0, {vocab})", f"tokens.{bad}")
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise InvalidParam(f"model {model.name} has no tokenizer")
    text = tokenizer.decode(body.tokens, skip_special_tokens=False)
    return {"content": text, "prompt": text}
