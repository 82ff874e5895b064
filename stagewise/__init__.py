"""stagewise: run LLMs as certified pipelines across the devices they need."""

from __future__ import annotations

__version__ = "0.1.0"
