"""The transformers baseline for ``stagewise bench --baseline transformers``.

Builds the Hugging Face model of the same config on the meta device, fills it with the very
tensors stagewise loaded from the same source (names are the checkpoint's), and dispatches it with
accelerate's device map over the same devices and the same block split.
"""

from __future__ import annotations

from typing import Any

import torch

from stagewise.engine.loaded_model import LoadedModel
from stagewise.errors import ConfigError

_CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "qwen3_next": "Qwen3NextForCausalLM", "qwen3_5": "Qwen3_5ForCausalLM",
            "qwen3_5_moe": "Qwen3_5MoeForCausalLM"}


def build_hf_model(model: str, loaded: LoadedModel) -> tuple[Any, torch.device]:
    """(transformers model on the placement's devices, the entry device)."""
    try:
        import transformers
        from accelerate import dispatch_model, init_empty_weights
    except ImportError as exc:
        raise ConfigError(f"--baseline transformers needs transformers and accelerate ({exc})") from None
    from stagewise.engine.opened_model import open_model
    from stagewise.weights.make_model import load_hf_config

    config_source = baseline_config_source(model)
    opened = open_model(model)
    raw = load_hf_config(config_source)
    cls = getattr(transformers, _CLASSES[loaded.config.architecture])
    config = transformers.AutoConfig.for_model(**raw)
    with init_empty_weights():  # parameters on meta, buffers (rotary tables) real
        hf = cls(config)
    devices = {k: st.device for k, st in enumerate(loaded.pipeline.stages)}
    device_map: dict[str, Any] = {}
    for k, st in enumerate(loaded.pipeline.stages):
        for i in range(st.spec.start, st.spec.end):
            device_map[f"model.layers.{i}"] = str(devices[k])
    first, last = str(devices[0]), str(devices[len(devices) - 1])
    device_map.update({"model.embed_tokens": first, "model.rotary_emb": first, "model.norm": last, "lm_head": last})
    state: dict[str, torch.Tensor] = {}
    names = dict(hf.named_parameters())
    for name in names:
        src = name
        if src == "lm_head.weight" and src not in opened.source.names():
            src = "model.embed_tokens.weight"
        target = _device_for(name, device_map)
        state[name] = opened.source.load(src, torch.device(target), loaded.dtype)
    hf.load_state_dict(state, assign=True, strict=False)
    if loaded.config.tie_word_embeddings:
        hf.tie_weights()
    for name, buf in list(hf.named_buffers()):
        if buf.is_meta:
            raise ConfigError(f"transformers baseline: buffer {name} left on meta")
    hf = dispatch_model(hf.eval(), device_map=device_map)
    return hf, torch.device(first)


def baseline_config_source(model: str) -> str:
    """The config name transformers builds ``model`` from (a directory, or the preset of ``random:PRESET``);
    ConfigError for a model it cannot run (a GGUF file, packed ``random:PRESET@TYPE`` weights). Checked before
    anything loads, so ``bench --baseline`` refuses such a model at once, not after its own run."""
    from stagewise.weights.model_path import random_preset

    if model.endswith(".gguf"):
        raise ConfigError("--baseline transformers needs a safetensors directory or random:PRESET, not a GGUF file")
    random = random_preset(model)
    if random is None:
        return model
    if random[1] != "dense":
        raise ConfigError(f"--baseline transformers runs dense weights; drop the @{random[1]} suffix")
    return random[0]


def _device_for(name: str, device_map: dict[str, Any]) -> str:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in device_map:
            return str(device_map[key])
    raise ConfigError(f"transformers baseline: no device for {name}")
