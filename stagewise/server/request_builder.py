"""Turn validated OpenAI bodies into :class:`EngineRequest` s (template, tokens, sampling, stops)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from stagewise.engine.chat_template import own_variable
from stagewise.engine.grammar import Grammar
from stagewise.engine.reasoning_stream import has_reasoning_tags, starts_in_reasoning
from stagewise.engine.request import EngineRequest
from stagewise.engine.sampling_params import SamplingParams
from stagewise.engine.tokenizer import Tokenizer
from stagewise.engine.tool_calls import ToolCallFormat, ToolParams, detect_tool_call_format, tool_params
from stagewise.errors import ContextLengthExceeded, StagewiseError
from stagewise.server.model_facts import ModelFacts
from stagewise.server.openai_errors import InvalidParam, from_validation
from stagewise.server.schemas import ChatCompletionBody, ChatMessage, CompletionBody, SamplingFields
from stagewise.server.structured_output import response_format_grammar, tool_choice_grammar

COMPLETION_MAX_TOKENS = 16  # /v1/completions without max_tokens, as OpenAI (chat: the rest of the context)
GREEDY_BELOW_TEMPERATURE = 1e-5  # a smaller positive temperature is greedy (vLLM's _SAMPLING_EPS)
MIN_TOP_P = 1e-5  # a smaller positive top_p acts as this (only the most likely token survives)
MAX_CHOICES = 16  # n per request; each choice is an engine request of its own
MAX_PROMPTS = 64  # prompts of one /v1/completions request (a batch, as vLLM takes them)
MAX_ENGINE_REQUESTS = 64  # prompts x n of one HTTP request


@dataclass(frozen=True)
class BuiltRequest:
    """The engine requests (one per choice, ``n``) plus how to shape the response."""

    response_id: str  # the completion's id: chatcmpl-<request id> / cmpl-<request id>
    requests: tuple[EngineRequest, ...]
    stream: bool
    include_usage: bool
    tool_format: ToolCallFormat | None = None  # set when tools were offered: parse the output for calls
    forced_tools: tuple[str, ...] = ()  # the functions a forced tool_choice allows (required, or named)
    # a thinking model's reasoning returned apart (chat only): None = no split; True = the prompt opened the block
    reasoning: bool | None = None
    prompts: int = 1  # a completions batch: requests are prompt after prompt, each prompt's n choices together
    response_fields: dict[str, Any] = field(default_factory=dict)  # request fields the response repeats (Responses API)
    tool_params: ToolParams = field(default_factory=dict)  # the offered tools' parameter schemas (qwen_xml values)

    def __post_init__(self) -> None:
        if not 1 <= len(self.requests) <= MAX_ENGINE_REQUESTS or len(self.requests) % self.prompts:
            raise ValueError(f"a response has 1..{MAX_ENGINE_REQUESTS} choices, n for each of {self.prompts} "
                             f"prompts, got {len(self.requests)}")

    def first_of_each_prompt(self, items: list[Any]) -> list[Any]:
        """Of per-choice ``items`` (in request order), those of each prompt's first choice (usage counts a
        prompt once)."""
        return items[:: len(self.requests) // self.prompts]

    @property
    def request(self) -> EngineRequest:
        """The first choice's request (every choice asks the same but for its seed)."""
        return self.requests[0]


def _choices(response_id: str, request: EngineRequest, n: int | None) -> tuple[EngineRequest, ...]:
    """``n`` copies of ``request``: ids ``<response id>-<i>`` and seeds ``seed + i`` (a seed given) when n > 1."""
    n = 1 if n is None else n
    if not 1 <= n <= MAX_CHOICES:
        raise InvalidParam(f"n must be in [1, {MAX_CHOICES}], got {n}", "n")
    if n == 1:
        return (request,)
    seed = request.sampling.seed
    return tuple(
        replace(request, request_id=f"{response_id}-{i}",
                sampling=replace(request.sampling, seed=None if seed is None else seed + i))
        for i in range(n)
    )


def _tokenizer(model: ModelFacts) -> Tokenizer:
    if model.tokenizer is None:
        raise InvalidParam(f"model {model.name} has no tokenizer")
    return model.tokenizer


def _logit_bias(asked: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` as ``((id, bias), ...)``; ids must be in the model's vocabulary."""
    if not asked:
        return ()
    pairs = []
    for key, bias in asked.items():
        if len(key) > 12 or not key.isascii() or not key.isdigit() or not 0 <= int(key) < vocab_size:
            raise InvalidParam(f"logit_bias keys must be token ids in [0, {vocab_size}), got {key!r}", "logit_bias")
        pairs.append((int(key), bias))
    return tuple(pairs)


def _sampling(body: SamplingFields, vocab_size: int, grammar: Grammar | None) -> SamplingParams:
    fields: dict[str, Any] = {name: getattr(body, name) for name in (
        "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed")}
    if fields["temperature"] is not None and 0 < fields["temperature"] < GREEDY_BELOW_TEMPERATURE:
        fields["temperature"] = 0.0  # dividing the logits by it would overflow to inf and NaN
    if fields["top_p"] is not None and 0 < fields["top_p"] < MIN_TOP_P:
        fields["top_p"] = MIN_TOP_P  # keeps the top token, as any tiny top_p; smaller rounds to 0 in float32
    fields["logit_bias"] = _logit_bias(body.logit_bias, vocab_size)
    fields["grammar"] = grammar
    try:
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    except StagewiseError as exc:
        param = next((k for k in fields if k in str(exc)), None)
        raise InvalidParam(str(exc), param) from exc


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _max_tokens(asked: int | None, prompt_tokens: int, context: int, default: int | None = None) -> int:
    """``asked``, else ``default`` (at most what the context leaves), else the rest of the context."""
    if prompt_tokens >= context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens; the prompt has {prompt_tokens} tokens."
        )
    if asked is None:
        return min(default, context - prompt_tokens) if default is not None else context - prompt_tokens
    if asked < 1:
        raise InvalidParam(f"max_tokens must be >= 1, got {asked}", "max_tokens")
    if prompt_tokens + asked > context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + asked} tokens ({prompt_tokens} in the messages, {asked} in the completion)."
        )
    return asked


def _engine_request(request_id: str, prompt_ids: list[int], asked: int | None, body: SamplingFields,
                    model: ModelFacts, logprobs: bool, top_logprobs: int,
                    default_max_tokens: int | None = None, grammar: Grammar | None = None) -> EngineRequest:
    try:
        return EngineRequest(
            request_id=request_id,
            prompt_ids=tuple(prompt_ids),
            max_tokens=_max_tokens(asked, len(prompt_ids), model.max_context, default_max_tokens),
            sampling=_sampling(body, model.vocab_size, grammar),
            stop=_stops(body.stop),
            # a grammar ends on its end-of-generation token: ignore_eos leaves it be
            stop_token_ids=frozenset() if body.ignore_eos and grammar is None else model.stop_token_ids,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
        )
    except InvalidParam:
        raise
    except ContextLengthExceeded as exc:
        raise InvalidParam(str(exc), "messages" if request_id.startswith("chatcmpl") else "prompt", exc.code) from exc
    except StagewiseError as exc:
        param = next((k for k in ("stop", "top_logprobs", "max_tokens") if k in str(exc)), None)
        raise InvalidParam(str(exc), param) from exc


def prompt_ids(text: str, model: ModelFacts, param: str, add_special_tokens: bool = False) -> list[int]:
    """``text`` tokenized, after a check by bytes that needs no tokenizing: a text longer than the context's
    tokens × the tokenizer's longest token cannot fit, and is refused at once (a 3.9 MB prompt in
    microseconds, not seconds of tokenizing)."""
    tokenizer = _tokenizer(model)
    # NOTE: len(text) bounds the UTF-8 size from below; only a text that might be too long is encoded
    limit_bytes = model.max_context * tokenizer.max_token_bytes
    if len(text) > limit_bytes and (size_bytes := len(text.encode("utf-8", "surrogatepass"))) > limit_bytes:
        raise InvalidParam(
            f"This model's maximum context length is {model.max_context} tokens; the prompt is {size_bytes} bytes, "
            f"more than {limit_bytes} bytes ({model.max_context} tokens of at most {tokenizer.max_token_bytes} "
            "bytes each) can hold.", param, ContextLengthExceeded.code)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def template_variables(*given: dict[str, Any] | None) -> dict[str, Any]:
    """``chat_template_kwargs`` (the server's default, then the request's over it) as template variables;
    a 400 for a name the server itself sets."""
    merged: dict[str, Any] = {}
    for kwargs in given:
        merged.update(kwargs or {})
    if (clash := own_variable(merged)) is not None:
        raise InvalidParam(f"chat_template_kwargs cannot set {clash!r}: the request's own fields do",
                           "chat_template_kwargs")
    return merged


def render_chat(chat: list[ChatMessage], model: ModelFacts, tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = True, variables: dict[str, Any] | None = None) -> str:
    """The prompt text of ``chat`` rendered through the model's chat template (``tools`` offered; ``variables``
    from :func:`template_variables`)."""
    tokenizer = _tokenizer(model)
    for i, asked in enumerate(chat):  # as OpenAI: content is required but on an assistant message with tool_calls
        if asked.content is None and not (asked.role == "assistant" and asked.tool_calls):
            needs = "content or tool_calls" if asked.role == "assistant" else "content (a string or text parts)"
            raise InvalidParam(f"messages.{i}: a {asked.role} message needs {needs}", f"messages.{i}.content")
    messages = [m.model_dump(exclude_none=True) for m in chat]
    for message in messages:
        if message["role"] == "developer":  # OpenAI's newer name for the system role
            message["role"] = "system"
    try:
        return model.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                          special_tokens=tokenizer.special_tokens_map, **(variables or {}))
    except StagewiseError as exc:
        raise InvalidParam(str(exc), "messages") from exc


_TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # OpenAI's function names: a-z, A-Z, 0-9, _ and -, up to 64


def _check_tool(tool: dict[str, Any], param: str) -> None:
    """A tool as OpenAI requires it: ``{"type": "function", "function": {"name": <1-64 of [a-zA-Z0-9_-.]>,
    "parameters": <object>?, "description": <string>?}}``."""
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise InvalidParam("each tool must be {'type': 'function', 'function': {...}}", param)
    name = function.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise InvalidParam("each tool function needs a name of 1 to 64 letters, digits, '_', '-' or '.'",
                           f"{param}.function.name")
    if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
        raise InvalidParam(f"the parameters of tool {name!r} must be a JSON schema object", f"{param}.function.parameters")
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise InvalidParam(f"the description of tool {name!r} must be a string", f"{param}.function.description")


def _offered_tools(body: ChatCompletionBody) -> list[dict[str, Any]] | None:
    """The tools the template offers: none with ``tool_choice: "none"``."""
    return body.tools if body.tools and body.tool_choice != "none" else None


def chat_prompt(body: ChatCompletionBody, model: ModelFacts, template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text of a chat request: its messages and offered tools through the model's template, with the
    server's ``template_kwargs`` under the request's ``reasoning_effort`` and ``chat_template_kwargs``."""
    for i, tool in enumerate(body.tools or ()):
        _check_tool(tool, f"tools.{i}")  # offered or not (tool_choice 'none'), a malformed tool is a 400
    effort = {"reasoning_effort": body.reasoning_effort} if body.reasoning_effort is not None else None
    variables = template_variables(template_kwargs, effort, body.chat_template_kwargs)
    return render_chat(body.messages, model, _offered_tools(body), variables=variables)


def build_chat(body: ChatCompletionBody, model: ModelFacts, request_id: str, split_reasoning: bool = True,
               template_kwargs: dict[str, Any] | None = None) -> BuiltRequest:
    """Render the messages through the model's chat template (``template_kwargs``: the server's
    ``--chat-template-kwargs``, under the request's) and tokenize them; the completion id is
    ``chatcmpl-<request_id>``. ``split_reasoning``: a thinking model's ``<think>`` block is returned apart
    (:mod:`~stagewise.engine.reasoning_stream`), except under a grammar, which shapes the whole output."""
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidParam("top_logprobs needs logprobs=true", "top_logprobs")
    text = chat_prompt(body, model, template_kwargs)
    tools = _offered_tools(body)
    ids = prompt_ids(text, model, "messages")
    tool_format = detect_tool_call_format(model.chat_template.source)
    grammar = tool_choice_grammar(body.tool_choice, tools, tool_format, model)
    if grammar is not None and body.response_format not in (None, {"type": "text"}):
        raise InvalidParam("response_format cannot be enforced together with a forced tool_choice", "response_format")
    grammar = grammar or response_format_grammar(body.response_format, model)
    asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    response_id = f"chatcmpl-{request_id}"
    request = _engine_request(response_id, ids, asked, body, model, bool(body.logprobs), body.top_logprobs or 0,
                              grammar=grammar)
    fmt = tool_format if tools is not None else None
    forced = _forced_tools(body.tool_choice, tools) if grammar is not None and fmt is not None else ()
    reasoning = None
    if split_reasoning and grammar is None and has_reasoning_tags(model.chat_template.source):
        reasoning = starts_in_reasoning(text)
    return BuiltRequest(response_id, _choices(response_id, request, body.n), bool(body.stream), _include_usage(body),
                        fmt, forced, reasoning, tool_params=tool_params(tools))


def chat_request(fields: dict[str, Any]) -> ChatCompletionBody:
    """The chat body of another API's request, from the chat ``fields`` it asks for (validated as a body is)."""
    try:
        return ChatCompletionBody.model_validate(fields)
    except ValidationError as exc:
        raise from_validation(exc) from exc


def build_chat_as(fields: dict[str, str], chat: ChatCompletionBody, model: ModelFacts, request_id: str,
                  split_reasoning: bool = True, template_kwargs: dict[str, Any] | None = None) -> BuiltRequest:
    """:func:`build_chat` of another API's request read as ``chat``: an error naming a chat field names that
    API's (``fields``: chat's name -> its own; ``messages`` loses its index, which is not the API's item's)."""
    try:
        return build_chat(chat, model, request_id, split_reasoning, template_kwargs)
    except InvalidParam as exc:
        if exc.param is not None and (head := exc.param.split(".")[0]) in fields:
            exc.param = fields[head] if head == "messages" else fields[head] + exc.param[len(head):]
        raise


def _forced_tools(tool_choice: str | dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> tuple[str, ...]:
    """The function names a forced ``tool_choice`` (already checked by its grammar) allows."""
    names = tuple(str(t["function"].get("name")) for t in tools or [])
    if isinstance(tool_choice, dict):
        return tuple(n for n in names if n == (tool_choice.get("function") or {}).get("name"))
    return names if tool_choice == "required" else ()


def _prompts(prompt: str | list[int] | list[str] | list[list[int]]) -> list[str | list[int]]:
    """The prompts of a completions body: one (text, or token ids), or a batch of them."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return [prompt]  # type: ignore[list-item]  # NOTE: list[int] here (mypy cannot narrow a list by its item)
    if len(prompt) > MAX_PROMPTS:
        raise InvalidParam(f"a request takes at most {MAX_PROMPTS} prompts, got {len(prompt)}", "prompt")
    return list(prompt)


def build_completion(body: CompletionBody, model: ModelFacts, request_id: str,
                     default_max_tokens: int | None = COMPLETION_MAX_TOKENS) -> BuiltRequest:
    """Tokenize (or take) the prompts of a text completion (one, or a batch: each prompt's ``n`` choices in
    turn, indexed ``prompt * n + choice`` as OpenAI orders them); the completion id is ``cmpl-<request_id>``.
    Without ``max_tokens``, ``default_max_tokens`` (OpenAI's 16; None: the rest of the context)."""
    if body.echo:
        raise InvalidParam("echo is not supported", "echo")
    if body.suffix:
        raise InvalidParam("suffix is not supported", "suffix")
    top = body.logprobs
    if top is not None and not 0 <= top <= 5:
        raise InvalidParam(f"logprobs must be in [0, 5], got {top}", "logprobs")
    prompts = _prompts(body.prompt)
    n = 1 if body.n is None else body.n
    if len(prompts) * n > MAX_ENGINE_REQUESTS:
        raise InvalidParam(f"{len(prompts)} prompts x n={n} is more than the {MAX_ENGINE_REQUESTS} completions a "
                           "request may ask for", "n")
    response_id = f"cmpl-{request_id}"
    grammar = response_format_grammar(body.response_format, model)
    requests: list[EngineRequest] = []
    for i, prompt in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt.{i}"
        ids = prompt_ids(prompt, model, param) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise InvalidParam("the prompt is empty", param)
        if any(not 0 <= t < model.vocab_size for t in ids):
            raise InvalidParam(f"prompt token ids must be in [0, {model.vocab_size})", param)
        request = _engine_request(response_id, ids, body.max_tokens, body, model, top is not None, top or 0,
                                  default_max_tokens, grammar)
        requests += _choices(response_id, request, body.n)
    if len(requests) > 1:  # every engine request its own id
        requests = [replace(r, request_id=f"{response_id}-{k}") for k, r in enumerate(requests)]
    return BuiltRequest(response_id, tuple(requests), bool(body.stream), _include_usage(body), prompts=len(prompts))


def _include_usage(body: SamplingFields) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)
