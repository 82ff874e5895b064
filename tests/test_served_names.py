"""ServedNames: which ``model`` fields name the served model (its name, the path given, that path's last part)."""

from __future__ import annotations

import pytest

from stagewise.server.openai_errors import UnknownModel
from stagewise.server.served_names import ServedNames


def test_names_and_aliases() -> None:
    names = ServedNames.of("llama-8b", "/models/llama-8b/")
    assert names.names == ("llama-8b", "/models/llama-8b/")
    for ok in (None, "llama-8b", "/models/llama-8b/"):
        names.check(ok)
    with pytest.raises(UnknownModel) as info:
        names.check("gpt-4o")
    assert info.value.http_status == 404 and info.value.code == "model_not_found"


def test_random_preset_and_demo() -> None:
    ServedNames.of("random:tiny-llama", "random:tiny-llama").check("random:tiny-llama")
    demo = ServedNames.of("demo", None)
    assert demo.names == ("demo",)
    demo.check("demo")
    with pytest.raises(UnknownModel):
        demo.check("x")
