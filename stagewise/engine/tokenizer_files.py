"""Read a Hugging Face tokenizer directory into one frozen record.

Files, in the order they are consulted:

* ``tokenizer.json`` (required): the `tokenizers` pipeline;
* ``tokenizer_config.json``: ``bos_token`` / ``eos_token`` / ``pad_token`` / ``unk_token``,
  ``added_tokens_decoder``, ``chat_template``. ``add_bos_token`` / ``add_eos_token`` are ignored,
  as transformers (v5) ignores them for tokenizer.json tokenizers: the tokenizer.json
  post-processor alone decides what ``add_special_tokens=True`` adds;
* ``chat_template.jinja`` (or ``chat_template.json``): overrides the config's template, as in transformers;
* ``generation_config.json``: ``eos_token_id`` (int or list) joins the ids that end generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from stagewise.errors import ConfigError, CorruptModelFile, ModelNotFound
from stagewise.spec.config_fields import read_json_object

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclass(frozen=True)
class HfTokenizerFiles:
    """What a tokenizer directory says. ``special_tokens_map`` maps ``bos_token`` etc. to token text."""

    backend: BackendTokenizer
    special_tokens_map: dict[str, str]
    generation_eos_ids: frozenset[int]
    chat_template: str | None


def read_tokenizer_dir(path: str | Path) -> HfTokenizerFiles:
    """Load ``path``'s tokenizer files.

    Raises:
        ModelNotFound: ``path`` has no tokenizer.json.
        CorruptModelFile: a file does not parse.
        ConfigError: a field has the wrong shape.
    """
    root = Path(path)
    tokenizer_file = root / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ModelNotFound(f"{tokenizer_file} does not exist")
    try:
        backend = BackendTokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # the Rust side raises bare Exception
        raise CorruptModelFile(f"{tokenizer_file} does not parse: {exc}") from exc
    config = _read_json(root / "tokenizer_config.json")
    _add_config_tokens(backend, config, root / "tokenizer_config.json")
    special = {name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name))) is not None}
    return HfTokenizerFiles(
        backend=backend,
        special_tokens_map=special,
        generation_eos_ids=_generation_eos_ids(root / "generation_config.json"),
        chat_template=_chat_template(root, config),
    )


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    return read_json_object(file, CorruptModelFile)


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):  # serialized AddedToken: {"content": ..., ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


def _add_config_tokens(backend: BackendTokenizer, config: dict[str, Any], file: Path) -> None:
    # transformers adds `added_tokens_decoder` entries the tokenizer.json lacks; so do we.
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise ConfigError(f"{file}: added_tokens_decoder is not an object")
    vocab = backend.get_vocab(with_added_tokens=True)
    missing = [entry for entry in decoder.values() if isinstance(entry, dict) and entry.get("content") not in vocab]
    for entry in sorted(missing, key=lambda e: str(e.get("content"))):
        token = AddedToken(
            str(entry["content"]),
            single_word=bool(entry.get("single_word", False)),
            lstrip=bool(entry.get("lstrip", False)),
            rstrip=bool(entry.get("rstrip", False)),
            normalized=bool(entry.get("normalized", not entry.get("special", False))),
            special=bool(entry.get("special", False)),
        )
        if token.special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])


def _generation_eos_ids(file: Path) -> frozenset[int]:
    value = _read_json(file).get("eos_token_id")
    if value is None:
        return frozenset()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{file}: eos_token_id must be an int or a list of ints")
    return frozenset(values)


def _chat_template(root: Path, config: dict[str, Any]) -> str | None:
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = _read_json(root / "chat_template.json").get("chat_template", config.get("chat_template"))
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ConfigError(f"{root / 'tokenizer_config.json'}: chat_template is not a string")
    return template or None
