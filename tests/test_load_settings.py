"""One settings object from the CLI, one profile decided once: each setting reaches the step that uses it.

``stagewise run`` and ``serve`` turn their options into one frozen :class:`LoadSettings`; the load decides
one :class:`Profile`, certifies it and carries it in :class:`LoadedModel`; the generator, the batcher and
every stage's state read it from there. These tests go through the commands' public behaviour and
look at what each step ran (the token counts every stage was handed) and what each stage holds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from typing import Any

import pytest
import torch

from stagewise.cli.main import main
from stagewise.engine.load_settings import LoadSettings, add_model_arguments, load_settings_from_args
from stagewise.engine.loaded_model import LoadedModel
from stagewise.errors import ConfigError
from stagewise.runtime.stage import Stage

MODEL = "random:tiny-llama"
PROMPT = ",".join(str(i) for i in range(3, 23))  # 20 tokens


@pytest.fixture()
def run_spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Records every step each stage runs (tokens handed to it) and the model ``run`` loaded."""
    seen: dict[str, Any] = {"steps": [], "loaded": None}
    original_run = Stage.run

    def spy_run(self: Stage, inputs: torch.Tensor, positions: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.spec.index == 0:
            seen["steps"].append(int(positions.numel()))
        return original_run(self, inputs, positions, *args, **kwargs)

    import stagewise.engine.model_loading as model_loading  # run imports it when it runs (torch)

    original_load = model_loading.load_model_from_args

    def spy_load(*args: Any, **kwargs: Any) -> LoadedModel:
        loaded = original_load(*args, **kwargs)
        stage = loaded.pipeline.stages[0]
        pool = loaded.pipeline.kv_pool
        seen["loaded"] = loaded
        kv = [state.key.dtype for state in stage.states.values() if hasattr(state, "key")]
        seen["held"] = {"blocks_per_row": stage.block_table.blocks_per_row, "dtype": stage.dtype, "kv": kv,
                        "pool_tokens": pool.tokens if pool is not None else None,
                        "devices": [s.spec.device for s in loaded.pipeline.stages]}  # before run closes it
        return loaded

    monkeypatch.setattr(Stage, "run", spy_run)
    monkeypatch.setattr(model_loading, "load_model_from_args", spy_load)
    return seen


def _run(*argv: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", MODEL, "--prompt-tokens", PROMPT, "--max-tokens", "4", "--json", *argv]) == 0
    return json.loads(out.getvalue())


def test_prefill_chunk_3_runs_3_token_steps(run_spy: dict[str, Any]) -> None:
    # the certificate bounds 3-token chunks; the 20-token prompt must run as 3-token steps, never one big one
    out = _run("--prefill-chunk", "3", "--context", "64")
    assert out["placement"]["profile"]["prefill_chunk_tokens"] == 3
    loaded = run_spy["loaded"]
    assert loaded.profile.prefill_chunk_tokens == 3 == loaded.prefill_chunk
    prefill = run_spy["steps"][:7]
    assert prefill == [3, 3, 3, 3, 3, 3, 2], run_spy["steps"]
    assert max(run_spy["steps"]) == 3
    assert run_spy["steps"][7:] == [1, 1, 1]  # decode: one token a step (the 4th token needs no step)


def test_default_chunk_runs_the_prompt_in_one_step(run_spy: dict[str, Any]) -> None:
    _run("--context", "64")
    assert run_spy["loaded"].profile.prefill_chunk_tokens == 512
    assert run_spy["steps"][0] == 20


@pytest.mark.parametrize(("argv", "check"), [
    (("--context", "192"), lambda m, h: (m.profile.context_tokens, m.max_context, h["blocks_per_row"]) == (192, 192, 3)),
    (("--context", "128", "--kv-tokens", "320"), lambda m, h: h["pool_tokens"] == 320 == m.profile.kv_pool_tokens),
    (("--context", "64", "--dtype", "bfloat16"),
     lambda m, h: h["dtype"] == torch.bfloat16 and m.profile.activation_dtype == "bf16"),
    (("--context", "64", "--devices", "cpu:2x64MiB", "--placement", "pipeline:2"),
     lambda m, h: h["devices"] == ["cpu:0", "cpu:1"]),
    (("--context", "64", "--kv-dtype", "fp8"),
     lambda m, h: m.profile.kv_storage == "fp8" and h["kv"] and set(h["kv"]) == {torch.float8_e4m3fn}),
])
def test_each_run_setting_reaches_its_consumer(run_spy: dict[str, Any], argv: tuple[str, ...], check: Any) -> None:
    out = _run(*argv)
    loaded = run_spy["loaded"]
    assert out["placement"]["profile"] == loaded.profile.to_dict()  # the certified profile is the carried one
    assert check(loaded, run_spy["held"])


def test_context_unset_takes_the_longest_that_fits(run_spy: dict[str, Any]) -> None:
    # tiny-llama's max_position_embeddings is 2,048: roomy CPU budgets hold it all
    _run()
    loaded = run_spy["loaded"]
    assert loaded.profile.context_tokens == 2048 and loaded.profile.batch == 1
    assert "2,048 positions, 1 sequence, prefill chunks of 512: the model's longest context" == loaded.choice
    # a budget that holds less: the longest whole number of KV blocks that fits, no more
    run_spy["loaded"] = None
    _run("--devices", "cpu:1x6MiB")
    small = run_spy["loaded"]
    assert 64 <= small.profile.context_tokens < 2048 and small.profile.context_tokens % 64 == 0
    assert small.choice.endswith("the longest context that fits")


def _serve_settings(*argv: str) -> Any:
    from stagewise.cli.cmd_serve import register, settings_from_args

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return settings_from_args(parser.parse_args(["serve", MODEL, *argv]))


def test_serve_settings_carry_one_load_settings() -> None:
    settings = _serve_settings("--max-seqs", "3", "--context", "128", "--prefill-chunk", "16", "--kv-dtype", "fp8")
    assert settings.load == LoadSettings(model=MODEL, context=128, prefill_chunk=16, max_seqs=3, kv_dtype="fp8")
    assert _serve_settings().load.max_seqs is None  # auto by default
    with pytest.raises(AttributeError):
        settings.load.context = 4  # type: ignore[misc]  # frozen


def test_serve_max_seqs_and_chunk_reach_the_engine() -> None:
    from stagewise.engine.engine import Engine
    from stagewise.engine.model_loading import load
    from stagewise.server.random_tokenizer import with_demo_tokenizer

    settings = _serve_settings("--max-seqs", "3", "--context", "128", "--prefill-chunk", "16")
    model = with_demo_tokenizer(load(settings.load))
    try:
        engine = Engine(model)
        assert engine.batcher.slots == 3 == model.pipeline.rows == model.profile.batch
        assert engine.batcher.prefill_chunk == 16 == model.prefill_chunk
        assert engine.batcher.max_context == 128
    finally:
        model.close()


def test_settings_are_checked_once_at_the_edge() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    add_model_arguments(parser)
    args = parser.parse_args([MODEL, "--prefill-chunk", "0"])
    with pytest.raises(ConfigError, match="--prefill-chunk"):
        load_settings_from_args(args)
    with pytest.raises(ConfigError, match="--dtype"):
        LoadSettings(dtype="float8")
