"""Anthropic Messages response objects: the message, its content blocks, stream events, usage and errors."""

from __future__ import annotations

import json
from typing import Any

from stagewise.engine.request_output import RequestOutput

ANTHROPIC_PATH = "/v1/messages"  # this route and those under it answer in Anthropic's shapes, errors included

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``: Anthropic's error for an HTTP status."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def stop_reason(finish_reason: str, output: RequestOutput) -> str:
    """Anthropic's ``stop_reason`` for the chat finish reason of the last ``output``."""
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if output.stop_string is not None else "end_turn"


def usage(output: RequestOutput) -> dict[str, int]:
    """``input_tokens`` (the prompt's, less those read from the prefix cache, as Anthropic counts them),
    ``cache_read_input_tokens``, ``output_tokens``."""
    return {"input_tokens": output.prompt_tokens - output.cached_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": output.cached_tokens, "output_tokens": output.completion_tokens}


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks of a chat ``message`` (:func:`~stagewise.server.chat_handler.final_message`):
    thinking, text, then tool_use (an input that is not a JSON object, a call cut off, is ``{}``)."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        try:
            arguments = json.loads(call["function"]["arguments"])
        except json.JSONDecodeError:
            arguments = None
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": arguments if isinstance(arguments, dict) else {}})
    return blocks


def message(message_id: str, model: str, content: list[dict[str, Any]], reason: str | None,
            stop_sequence: str | None, use: dict[str, int]) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": stop_sequence, "usage": use}


def event(payload: dict[str, Any]) -> str:
    """One server-sent event named by the payload's ``type``."""
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"
