"""Request bodies of Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), validated
at the edge as the OpenAI bodies are (:mod:`stagewise.server.schemas`): strict types, unknown fields ignored.

Content blocks stay dicts here; :mod:`stagewise.server.apis.anthropic_request` reads each by its ``type``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class AnthropicTool(_Body):
    """A client tool (``input_schema``); a server tool (``type`` ``web_search_…``) is refused when read."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class AnthropicToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class AnthropicThinking(_Body):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class CountTokensBody(_Body):
    """``POST /v1/messages/count_tokens``: what a message request renders, without generating."""

    model: str | None = None
    messages: list[AnthropicMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinking | None = None


class MessagesBody(CountTokensBody):
    """``POST /v1/messages``."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
