"""ConfigFields: typed, range-checked reads of an outside config's fields (config.json, GGUF metadata).

Every read names the file and the field in a one-line :class:`ConfigError` when the value has the
wrong type (``"rms_norm_eps": "x"``, ``"tie_word_embeddings": "yes"``) or lies outside its range
(``"num_hidden_layers": 1000000000``), so nothing is sized by a value before it is checked.
JSON ``true``/``false`` are not integers here, and a number is finite.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from stagewise.errors import ConfigError

MAX_DIM = 1 << 24  # widths, vocabularies, positions: far beyond any model; a larger one is a broken file
MAX_LAYERS = 1 << 12  # blocks: the largest models have ~128
MAX_EXPERTS = 1 << 12
MAX_JSON_BYTES = 64 << 20  # a config.json is kilobytes; a bigger one is not read


def read_json_object(path: Path, error: type[Exception] = ConfigError) -> dict[str, Any]:
    """``path`` as a JSON object; ``error`` (one line, naming the file) when it cannot be read, is too
    big, nests too deep, or is not an object."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise error(f"{path}: {path.stat().st_size} bytes is too big for a JSON config (limit {MAX_JSON_BYTES})")
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise error(f"{path}: not valid JSON (values nested too deep)") from None
    except ValueError as exc:  # e.g. an integer of over 4300 digits
        raise error(f"{path}: not valid JSON ({str(exc).splitlines()[0] if str(exc) else 'bad value'})") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: the top level must be a JSON object")
    return raw


def _shown(value: Any) -> str:
    """A value as an error message shows it: short scalars as written, anything else by its JSON kind."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return f"a JSON array of {len(value)}"
    text = json.dumps(value) if isinstance(value, (bool, str)) else repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


class ConfigFields:
    """Reads fields of ``raw`` (one config object) as checked Python values; ``source`` names it in errors."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    def _fail(self, key: str, wanted: str, value: Any) -> ConfigError:
        return ConfigError(f"{self.source}: field {key!r} must be {wanted}, got {_shown(value)}")

    def present(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def int_(self, key: str, default: int | None = None, lo: int = 0, hi: int = MAX_DIM) -> int:
        """An integer in ``[lo, hi]``; ``default`` when absent or null (missing-field error without one)."""
        value = self.raw.get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"{self.source}: missing field {key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self._fail(key, f"an integer in [{lo}, {hi}]", value)
        return value

    def float_(self, key: str, default: float, lo: float = 0.0, hi: float = math.inf, lo_open: bool = True) -> float:
        """A finite number in ``(lo, hi]`` (``[lo, hi]`` with ``lo_open=False``); ``default`` when absent."""
        value = self.raw.get(key)
        if value is None:
            return default
        ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
              and (lo < value if lo_open else lo <= value) and value <= hi)
        if not ok:
            interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise self._fail(key, f"a finite number in {interval}", value)
        return float(value)

    def bool_(self, key: str, default: bool) -> bool:
        """A JSON ``true``/``false`` (not ``"yes"``, not 1); ``default`` when absent or null."""
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, "true or false", value)
        return value

    def str_(self, key: str, default: str) -> str:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, str) or len(value) > 256:
            raise self._fail(key, "a short string", value)
        return value

    def int_list(self, key: str, lo: int, hi: int, max_len: int, scalar_ok: bool = False) -> tuple[int, ...]:
        """A list of integers in ``[lo, hi]`` of at most ``max_len`` (one integer too, with ``scalar_ok``)."""
        value = self.raw.get(key)
        if value is None:
            return ()
        if scalar_ok and isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list) or len(value) > max_len or not all(
                isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi for v in value):
            raise self._fail(key, f"a list of at most {max_len} integers in [{lo}, {hi}]", value)
        return tuple(value)

    def str_list(self, key: str, max_len: int) -> tuple[str, ...]:
        value = self.raw.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or len(value) > max_len or not all(isinstance(v, str) for v in value):
            raise self._fail(key, f"a list of at most {max_len} strings", value)
        return tuple(value)

    def object_(self, key: str) -> dict[str, Any]:
        value = self.raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._fail(key, "a JSON object", value)
        return value
