"""Greedy decode with the host one token behind the device (Generator._lookahead) against the
host loop: same tokens, same stops, and a sequence that follows is unaffected by the step the
lookahead ran past the end. Run through Triton's interpreter on CPU (the device sampler is a Triton
kernel)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("the device sampler needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from stagewise.engine.generator import GenerationRequest, Generator
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.errors import StepCancelled
from stagewise.kernels.triton_launch import kernels_on_host

DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu:1x1GiB"
GREEDY = SamplingParams(temperature=0.0)


def _run(generator: Generator, request: GenerationRequest) -> list[tuple[int, float, str | None]]:
    return [(e.sample.token, e.sample.logprob, e.finish_reason) for e in generator.stream(request)]


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3.6"])
def test_lookahead_matches_the_host_loop(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_model(f"random:{preset}", devices=DEVICE, placement="single", context=64)
    try:
        generator = Generator(loaded.pipeline, loaded.max_context, prefill_chunk=8)
        request = GenerationRequest(tuple(range(1, 12)), 8, GREEDY)
        calls: list[int] = []
        lookahead = Generator._lookahead

        def spy(self: Generator, *args: object) -> object:
            calls.append(1)
            return lookahead(self, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(Generator, "_lookahead", spy)
        with kernels_on_host():
            ahead = _run(generator, request)
            assert calls == [1]  # the lookahead path ran
            monkeypatch.setattr(type(loaded.pipeline), "device_tokens", False)  # the host loop, same kernels
            host = _run(generator, request)
            monkeypatch.undo()
            assert calls == [1]  # ... and the host loop did not take it
            assert [t for t, _, _ in ahead] == [t for t, _, _ in host]
            assert ahead[-1][2] == host[-1][2] == "length"
            for (_, a, _), (_, b, _) in zip(ahead, host, strict=True):
                assert a == pytest.approx(b, abs=1e-5)
            # a stop token ends both at the same index; the step run past it leaves no trace
            stop = ahead[3][0]
            stopped = _run(generator, GenerationRequest(request.prompt_ids, 8, GREEDY, frozenset({stop})))
            first = next(i for i, (t, _, _) in enumerate(ahead) if t == stop)
            assert [t for t, _, _ in stopped] == [t for t, _, _ in ahead[: first + 1]]
            assert stopped[-1][2] == "stop"
            assert _run(generator, request) == ahead
            checks = iter(range(100))
            with pytest.raises(StepCancelled):
                for _ in generator.stream(request, cancel=lambda: next(checks) >= 4):
                    pass
            assert _run(generator, request) == ahead
    finally:
        loaded.close()
