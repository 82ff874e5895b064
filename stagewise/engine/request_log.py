"""One INFO log line per finished request (as vLLM and llama-server print): id, tokens, TTFT, rate, finish."""

from __future__ import annotations

import logging
from typing import TextIO

LOGGER = logging.getLogger("stagewise.requests")


def request_line(request_id: str, prompt_tokens: int, completion_tokens: int, ttft_s: float | None,
                 decode_s: float | None, total_s: float, finish_reason: str) -> str:
    """The line for one request. ``decode_s``: from its first token to its last (None with fewer than two
    tokens); ``total_s``: from its arrival to its end."""
    ttft = f"{ttft_s:.3f} s" if ttft_s is not None else "-"
    rate = f"{(completion_tokens - 1) / decode_s:.1f} tok/s" if decode_s and completion_tokens > 1 else "- tok/s"
    return (f"request {request_id}: prompt {prompt_tokens} tokens, completion {completion_tokens} tokens, "
            f"TTFT {ttft}, {rate}, {total_s:.3f} s in all, finish {finish_reason}")


def log_request(request_id: str, prompt_tokens: int, completion_tokens: int, ttft_s: float | None,
                decode_s: float | None, total_s: float, finish_reason: str) -> None:
    """Log :func:`request_line` at INFO on ``stagewise.requests`` (``stagewise serve`` prints it)."""
    if LOGGER.isEnabledFor(logging.INFO):
        LOGGER.info(request_line(request_id, prompt_tokens, completion_tokens, ttft_s, decode_s, total_s,
                                 finish_reason))


def print_requests(stream: TextIO | None = None) -> None:
    """Send ``stagewise.requests`` lines to stderr (or ``stream``), once; the server calls it at start."""
    if any(getattr(h, "_stagewise", False) for h in LOGGER.handlers):
        return
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s INFO %(message)s", "%H:%M:%S"))
    handler._stagewise = True  # type: ignore[attr-defined]
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False
