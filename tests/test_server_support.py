"""Helpers for the server tests: a small random model directory with a tokenizer, a served subprocess.

(No tests here; the module name keeps it among the files this suite owns.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from stagewise.weights.chatml_template import DEFAULT_CHATML
from stagewise.weights.tokenizer_train import save_for_hf, train_demo_tokenizer
from tests.hf_models import make_hf_model

MODEL_VOCAB = 448
TOKENIZER_VOCAB = 420
LLAMA_SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=MODEL_VOCAB)
REPO = Path(__file__).resolve().parent.parent


def make_model_dir(path: Path, seed: int = 3) -> Path:
    """A 4-block random Llama with the demo ChatML tokenizer (vocab padded to the model's)."""
    make_hf_model("llama", LLAMA_SMALL, path, seed=seed)
    tok = train_demo_tokenizer(TOKENIZER_VOCAB, pad_to=MODEL_VOCAB)
    save_for_hf(tok, path, chat_template=DEFAULT_CHATML)
    return path


def templated_model(factory: pytest.TempPathFactory, name: str, template: str) -> Iterator[Any]:
    """A loaded :func:`make_model_dir` model whose chat template is ``template`` (for a module-scoped fixture)."""
    from stagewise.engine.model_loading import load_model
    from stagewise.weights.tokenizer_train import save_for_hf, train_demo_tokenizer

    path = make_model_dir(factory.mktemp(name) / "m")
    save_for_hf(train_demo_tokenizer(TOKENIZER_VOCAB, pad_to=MODEL_VOCAB), path, chat_template=template)
    model = load_model(str(path), None, "single", 1024)
    yield model
    model.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServedModel:
    """A ``stagewise serve`` subprocess on 127.0.0.1."""

    process: subprocess.Popen[bytes]
    port: int
    api_key: str | None = None
    log: Path = field(default_factory=lambda: Path(os.devnull))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout_s: float = 120.0) -> None:  # a bound on a hang (a loaded machine loads slowly)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready: {self.log.read_text()[-3000:]}")

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=60.0).text  # a bound on a hang, not a measure
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)


@contextlib.contextmanager
def serving(served: ServedModel) -> Iterator[ServedModel]:
    """``served`` once ready; stopped afterwards, which must exit 0 (else its log's tail is the failure)."""
    try:
        served.wait_ready()
        yield served
    finally:
        assert served.stop() == 0, served.log.read_text()[-3000:]


@contextlib.contextmanager
def serving_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    """A tiny model served as ``x`` on one device (``--placement single``), ready; stopped afterwards."""
    model_dir = make_model_dir(tmp_path_factory.mktemp("served-model") / "x")
    served = start_server(model_dir, tmp_path_factory.mktemp("log") / "serve.log", "--placement", "single")
    with serving(served):
        yield served


def start_server(model_dir: Path, log: Path, *extra: str, api_key: str | None = None,
                 env: dict[str, str] | None = None) -> ServedModel:
    port = free_port()
    args = [sys.executable, "-m", "stagewise", "serve", str(model_dir), "--port", str(port), "--context", "256", *extra]
    if api_key:
        args += ["--api-key", api_key]
    full_env = {**os.environ, "STAGEWISE_FAULT_INJECTION": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("STAGEWISE_API_KEY", None)
    handle = log.open("wb")
    process = subprocess.Popen(args, cwd=REPO, env=full_env, stdout=handle, stderr=subprocess.STDOUT)
    return ServedModel(process, port, api_key, log)


def start_demo(log: Path, *extra: str, port: int | None = None, api_key: str | None = None) -> ServedModel:
    """``stagewise serve`` of the embedded demo model (two virtual CPU devices), as ``make demo`` runs it."""
    port = port or free_port()
    args = [sys.executable, "-m", "stagewise", "serve", "--port", str(port), *extra]
    if api_key:
        args += ["--api-key", api_key]
    env = {**os.environ, "STAGEWISE_FAULT_INJECTION": "1", "OMP_NUM_THREADS": "1"}
    env.pop("STAGEWISE_API_KEY", None)
    handle = log.open("ab")  # appended: a restarted server's log follows the first one's
    process = subprocess.Popen(args, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    return ServedModel(process, port, api_key, log)
