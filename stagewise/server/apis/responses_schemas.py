"""Request body of OpenAI's Responses API (``POST /v1/responses``), validated at the edge as the other bodies
are (:mod:`stagewise.server.schemas`): strict types, unknown fields ignored. Input items and tools stay dicts;
:mod:`stagewise.server.apis.responses_request` reads each by its ``type``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    stream: bool | None = None
    store: bool | None = None  # nothing is stored whatever it says; a previous_response_id is refused
    previous_response_id: str | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # as chat's
    reasoning: dict[str, Any] | None = None  # {"effort": ...}: chat's reasoning_effort
