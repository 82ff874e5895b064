"""Admission over real HTTP: a burst of ``--max-seqs + --queue`` streamed requests is all admitted and
completes; one more and exactly the surplus is refused (429, OpenAI's error shape, ``Retry-After``).

While the burst arrives every step is slowed to seconds (the server's fault-injection step delay), so
no request can finish (or free a slot) before the whole burst has its answer: whether a request is
admitted depends on the counts alone, never on timing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI

from tests.test_server_support import ServedModel, make_model_dir, serving, start_server

MAX_SEQS = 4
QUEUE = 2
MAX_TOKENS = 6  # with the burst's step delay, a request takes >= 6 steps of STEP_DELAY_S to finish
STEP_DELAY_S = 5.0
HANG_S = 120.0
HELLO = [{"role": "user", "content": "Hello, world! How are you today?"}]
NO_STOP = {"0": -100, "1": -100, "2": -100}  # the demo tokenizer's specials (EOS among them) never drawn


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    model_dir = make_model_dir(tmp_path_factory.mktemp("admission-model") / "x")  # served as "x"
    log = tmp_path_factory.mktemp("log") / "serve.log"
    served = start_server(model_dir, log, "--placement", "single", "--max-seqs", str(MAX_SEQS),
                          "--queue", str(QUEUE))
    with serving(served):
        yield served


def _set_delay(server: ServedModel, seconds: float) -> None:
    assert httpx.post(f"{server.url}/debug/step-delay", json={"seconds": seconds}).status_code == 200


class _Burst:
    """``n`` concurrent streamed chat requests through the openai client, one thread each."""

    def __init__(self, server: ServedModel, n: int) -> None:
        self.client = OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=HANG_S)
        self.lock = threading.Lock()
        self.answered = 0  # requests whose HTTP status is known (the stream's head, or a refusal)
        self.refusals: list[openai.RateLimitError] = []
        self.finishes: list[str | None] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._one, daemon=True) for _ in range(n)]
        for thread in self.threads:
            thread.start()

    def _one(self) -> None:
        try:
            stream = self.client.chat.completions.create(
                model="x", messages=HELLO, max_tokens=MAX_TOKENS, stream=True,  # type: ignore[arg-type]
                logit_bias=NO_STOP)
        except openai.RateLimitError as exc:
            with self.lock:
                self.answered += 1
                self.refusals.append(exc)
            return
        except BaseException as exc:
            with self.lock:
                self.answered += 1
                self.errors.append(exc)
            return
        with self.lock:
            self.answered += 1
        try:
            chunks = list(stream)
            finish = next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices)
            with self.lock:
                self.finishes.append(finish)
        except BaseException as exc:
            with self.lock:
                self.errors.append(exc)

    def wait_answered(self) -> None:
        deadline = time.monotonic() + HANG_S
        while self.answered < len(self.threads):
            assert time.monotonic() < deadline, f"only {self.answered} of {len(self.threads)} answered"
            time.sleep(0.01)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(HANG_S)
            assert not thread.is_alive(), "a streamed request never finished"


def _burst(server: ServedModel, n: int) -> _Burst:
    _set_delay(server, STEP_DELAY_S)
    try:
        burst = _Burst(server, n)
        burst.wait_answered()  # every request admitted or refused while no step can have finished one
    finally:
        _set_delay(server, 0.0)
    burst.join()
    return burst


def test_burst_of_max_seqs_plus_queue_all_complete(server: ServedModel) -> None:
    burst = _burst(server, MAX_SEQS + QUEUE)
    assert burst.errors == [] and burst.refusals == []
    assert burst.finishes == ["length"] * (MAX_SEQS + QUEUE)


def test_one_more_than_that_refuses_exactly_the_surplus(server: ServedModel) -> None:
    burst = _burst(server, MAX_SEQS + QUEUE + 1)
    assert burst.errors == []
    assert len(burst.refusals) == 1
    assert burst.finishes == ["length"] * (MAX_SEQS + QUEUE)
    refusal = burst.refusals[0]
    assert refusal.status_code == 429
    assert refusal.response.headers["retry-after"] == "1"
    error = refusal.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
