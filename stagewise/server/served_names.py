"""ServedNames: the names a request's ``model`` field may give for the one model this server serves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from stagewise.server.openai_errors import UnknownModel


@dataclass(frozen=True)
class ServedNames:
    """``name`` (what ``/v1/models`` lists) first, then its aliases: the model as given on the command
    line (a path, ``random:PRESET``) and that path's last part. A request without ``model`` means it."""

    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.names or not all(self.names):
            raise ValueError("a served model needs a non-empty name")

    @classmethod
    def of(cls, name: str, given: str | None) -> ServedNames:
        """The names of the model listed as ``name``, loaded from ``given`` (None: the demo)."""
        names = [name]
        if given:
            names += [given, PurePath(given.rstrip("/")).name]
        return cls(tuple(dict.fromkeys(n for n in names if n)))

    @property
    def name(self) -> str:
        return self.names[0]

    def check(self, requested: str | None) -> None:
        """Raise :class:`UnknownModel` (404 ``model_not_found``) unless ``requested`` is absent or one of the names."""
        if requested is None or requested in self.names:
            return
        raise UnknownModel(f"The model '{requested}' does not exist; this server serves '{self.name}'")
