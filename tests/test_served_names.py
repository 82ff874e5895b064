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


def test_a_model_file_answers_without_its_extension() -> None:
    names = ServedNames.of("tiny.gguf", "/models/tiny.gguf")
    assert names.name == "tiny.gguf"
    for ok in ("tiny.gguf", "tiny", "/models/tiny.gguf", "/models/tiny"):
        names.check(ok)
    with pytest.raises(UnknownModel):
        names.check("tiny.gg")
    ServedNames.of(".gguf", ".gguf").check(".gguf")  # nothing left without the extension: no empty alias


def test_served_model_names_replace_the_defaults() -> None:
    names = ServedNames.of("tiny.gguf", "/models/tiny.gguf", ["team/tiny", "tiny-alias", "team/tiny"])
    assert names.names == ("team/tiny", "tiny-alias") and names.name == "team/tiny"
    with pytest.raises(UnknownModel):
        names.check("tiny.gguf")
