"""Request bodies of Ollama's API (``/api/chat``, ``/api/generate``, ``/api/show``), validated at the edge as the
other bodies are: strict types, unknown fields ignored. ``options`` stays a dict: the fields this server applies
are read by :mod:`stagewise.server.apis.ollama_request`, the rest (``num_ctx``, ``num_gpu``, ``repeat_penalty``, …)
are Ollama's runner settings, ignored as Ollama itself ignores the ones its runner lacks."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: str
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None


class OllamaGeneration(_Body):
    """What ``/api/chat`` and ``/api/generate`` share."""

    model: str | None = None
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema
    options: dict[str, Any] | None = None
    stream: bool = True  # Ollama streams unless told not to
    think: bool | None = None
    keep_alive: str | int | float | None = None  # the model stays loaded here whatever it says


class OllamaChatBody(OllamaGeneration):
    messages: list[OllamaMessage]
    tools: list[dict[str, Any]] | None = None


class OllamaGenerateBody(OllamaGeneration):
    prompt: str = ""
    system: str | None = None
    raw: bool = False  # the prompt as it is, no chat template
    images: list[str] | None = None
    suffix: str | None = None


class OllamaShowBody(_Body):
    model: str | None = None
    name: str | None = None  # the older field
