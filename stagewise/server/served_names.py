"""ServedNames: the names a request's ``model`` field may give for the one model this server serves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

from stagewise.server.openai_errors import UnknownModel

MODEL_FILE_SUFFIXES = (".gguf",)  # a model file's name answers without its extension too


@dataclass(frozen=True)
class ServedNames:
    """``name`` (what ``/v1/models`` lists and responses carry) first, then its aliases. A request without
    ``model`` means it."""

    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.names or not all(self.names):
            raise ValueError("a served model needs a non-empty name")

    @classmethod
    def of(cls, name: str, given: str | None, served: Sequence[str] = ()) -> ServedNames:
        """The names of the model listed as ``name``, loaded from ``given`` (None: the demo).

        ``served`` (``--served-model-name``, repeatable, as vLLM's): those names alone, the first listed.
        Otherwise ``name``, the model as given (a path, ``random:PRESET``) and that path's last part, each
        also without a model file's extension (``m.gguf`` answers as ``m``)."""
        if served:
            return cls(tuple(dict.fromkeys(served)))
        names = [name]
        if given:
            names += [given, PurePath(given.rstrip("/")).name]
        names += [n[: -len(s)] for n in names for s in MODEL_FILE_SUFFIXES if n.endswith(s) and len(n) > len(s)]
        return cls(tuple(dict.fromkeys(n for n in names if n)))

    @property
    def name(self) -> str:
        return self.names[0]

    def check(self, requested: str | None) -> None:
        """Raise :class:`UnknownModel` (404 ``model_not_found``) unless ``requested`` is absent or one of the names."""
        if requested is None or requested in self.names:
            return
        raise UnknownModel(f"The model '{requested}' does not exist; this server serves '{self.name}'")
