"""Greedy decode with the host one token behind the device (the batcher launches a greedy group's next
step from the tokens still on the device) against the host sampler: same tokens, same stops, and a
request that follows is unaffected by the step run past the end; a cancelled request raises and
leaves the generator ready. Through the Generator (the single-sequence path over the batcher), run
by Triton's interpreter on CPU (the device sampler is a Triton kernel)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("the device sampler needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.generator import Generator
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.errors import StepCancelled
from stagewise.kernels.triton_launch import kernels_on_host

DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu:1x1GiB"
GREEDY = SamplingParams(temperature=0.0)


def _run(generator: Generator, request: GenerationRequest) -> list[tuple[int, float, str | None]]:
    return [(e.sample.token, e.sample.logprob, e.finish_reason) for e in generator.stream(request)]


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3.6"])
def test_device_lookahead_matches_the_host_sampler(preset: str) -> None:
    loaded = load_model(f"random:{preset}", devices=DEVICE, placement="single", context=64)
    try:
        generator = Generator(loaded.pipeline, loaded.max_context, prefill_chunk=8)
        request = GenerationRequest(tuple(range(1, 12)), 8, GREEDY)
        host_request = GenerationRequest(request.prompt_ids, 8, GREEDY, top_logprobs=1)  # sampled on the host
        with kernels_on_host():
            ahead = _run(generator, request)
            host = _run(generator, host_request)
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
            events = generator.stream(request)
            assert next(events).sample.token == ahead[0][0]
            events.close()  # the consumer stops reading: the sequence ends, the next request runs alone
            assert _run(generator, request) == ahead
    finally:
        loaded.close()
