"""Request bodies of the OpenAI endpoints, validated once at the edge (pydantic, strict types).

Unknown fields are ignored, as OpenAI-compatible servers do; a field of the wrong type is a 400
naming it. Values are range-checked where they become engine types (``SamplingParams``,
``EngineRequest``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # a 64-bit signed integer, as vLLM (seed + i for n > 1 still fits torch)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class ChatMessage(BaseModel):
    """One message; extra keys (``name``, ``tool_calls``, ``tool_call_id``) pass to the template."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class SamplingFields(_Body):
    """Fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) → bias in [-100, 100]
    ignore_eos: bool = False  # vLLM's and llama.cpp's: no end-of-generation token ends it (benchmarks)
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None


class ChatCompletionBody(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables (vLLM's, llama.cpp's): enable_thinking
    reasoning_effort: str | None = None  # OpenAI's; a template variable of the same name (gpt-oss's templates read it)


class CompletionBody(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    response_format: dict[str, Any] | None = None  # as chat's (vLLM takes it on completions too)


class TokenizeBody(_Body):
    """``POST /tokenize`` (llama.cpp's and vLLM's): ``content`` or ``prompt`` text, or chat ``messages``."""

    model: str | None = None
    content: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special: bool | None = None  # llama.cpp's name
    add_special_tokens: bool | None = None  # vLLM's name
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # as chat's


class DetokenizeBody(_Body):
    """``POST /detokenize``: token ids back to text."""

    model: str | None = None
    tokens: list[int]
