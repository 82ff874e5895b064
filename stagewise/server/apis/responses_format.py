"""Responses API objects: the response, its output items (reasoning, message, function_call) and usage."""

from __future__ import annotations

from typing import Any

from stagewise.engine.request_output import RequestOutput


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message (``text`` None: just opened, no content part yet)."""
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(message: dict[str, Any], response_id: str, status: str) -> list[dict[str, Any]]:
    """The output items of a chat ``message`` (:func:`~stagewise.server.chat_handler.final_message`)."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(f"rs_{response_id}", message["reasoning_content"], "completed"))
    if message.get("content"):
        items.append(message_item(f"msg_{response_id}", message["content"], status))
    items += [call_item(c["id"], c["function"]["name"], c["function"]["arguments"], "completed")
              for c in message.get("tool_calls") or ()]
    return items


def usage(output: RequestOutput) -> dict[str, Any]:
    return {"input_tokens": output.prompt_tokens, "input_tokens_details": {"cached_tokens": output.cached_tokens},
            "output_tokens": output.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": output.prompt_tokens + output.completion_tokens}


def response(response_id: str, created_at: int, model: str, fields: dict[str, Any], status: str,
             output: list[dict[str, Any]], use: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``response`` object; ``fields``: what it repeats of the request; ``status`` ``in_progress``,
    ``completed`` or ``incomplete`` (cut off by ``max_output_tokens``)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": response_id, "object": "response", "created_at": created_at, "model": model, "status": status,
            "output": output, "usage": use, "incomplete_details": incomplete, "error": None,
            "previous_response_id": None, "store": False, "metadata": {}, "reasoning": None, **fields}
