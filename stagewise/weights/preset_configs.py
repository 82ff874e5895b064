"""Preset configs (``stagewise/assets/presets/*.json``) and HF config dicts, read without torch.

``random:PRESET`` and ``make-model --config PRESET`` name these; ``plan`` / ``assess`` read them
through here so they never import the model code.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from stagewise.errors import ConfigError, ModelNotFound

_HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
}


def preset_names() -> list[str]:
    """Names accepted by ``--config`` besides a path (``stagewise/assets/presets/*.json`` stems)."""
    root = resources.files("stagewise") / "assets" / "presets"
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def load_hf_config(config: str | Path | dict[str, Any]) -> dict[str, Any]:
    """A text-only HF config dict from a path, a preset name or a dict (multimodal configs are flattened)."""
    if isinstance(config, dict):
        raw = dict(config)
    else:
        path = Path(config)
        if not path.exists():
            if str(config) not in preset_names():
                raise ModelNotFound(f"{config}: no such config file or preset (presets: {', '.join(preset_names())})")
            path = Path(str(resources.files("stagewise") / "assets" / "presets" / f"{config}.json"))
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a readable JSON config ({exc})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a JSON object")
    if isinstance(raw.get("text_config"), dict):  # write the language model only
        text = dict(raw["text_config"])
        text.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", False))
        if not str(text.get("model_type", "")).endswith("_text"):
            text["model_type"] = f"{raw.get('model_type')}_text"
        raw = text
    model_type = str(raw.get("model_type"))
    raw["architectures"] = [_HF_ARCHITECTURES.get(model_type, (raw.get("architectures") or [None])[0])]
    for key in ("_name_or_path", "id2label", "label2id"):
        raw.pop(key, None)
    return raw
