"""``stagewise chat`` through the CLI entry, with scripted stdin: a conversation of several turns."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from stagewise.cli.main import main
from tests.test_server_support import make_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("chat-model"))


def test_three_turns_in_a_small_context(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # the default --max-tokens (512) is far past the 96-token context: each reply may fill what is left
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello there\nAnd a second question?\nA third one\n/exit\n"))
    code = main(["chat", str(model_dir), "--placement", "single", "--context", "96", "--temperature", "0"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "error" not in out.err, out.err
    replies = [line for line in out.out.splitlines() if line.strip()]
    assert len(replies) >= 3, out.out  # one reply per turn (a reply may span lines)


def test_message_longer_than_the_context_is_reported(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("word " * 200 + "\nshort\n"))
    code = main(["chat", str(model_dir), "--placement", "single", "--context", "96", "--temperature", "0"])
    out = capsys.readouterr()
    assert code == 0
    errors = [line for line in out.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "96-token context" in errors[0], out.err
    assert out.out.strip(), "the next message was answered"


def test_random_preset_chats_with_the_demo_tokenizer(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # what `serve random:PRESET`'s banner prints: the same tokenizer serve attaches
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n/exit\n"))
    code = main(["chat", "random:tiny-qwen3", "--placement", "single", "--context", "64", "--max-tokens", "4",
                 "--temperature", "0"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Chatting with" in out.err and out.out  # a reply (random weights: maybe only whitespace)


def test_a_thinking_models_reasoning_goes_to_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from stagewise.weights.tokenizer_train import save_for_hf, train_demo_tokenizer
    from tests.test_server_reasoning import THINKING_TEMPLATE
    from tests.test_server_support import MODEL_VOCAB, TOKENIZER_VOCAB

    path = make_model_dir(tmp_path / "m")
    save_for_hf(train_demo_tokenizer(TOKENIZER_VOCAB, pad_to=MODEL_VOCAB), path, chat_template=THINKING_TEMPLATE)
    argv = ["chat", str(path), "--placement", "single", "--context", "96", "--temperature", "0", "--max-tokens", "12"]
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n"))
    assert main([*argv, "--reasoning-format", "none"]) == 0
    raw = capsys.readouterr().out.strip()
    assert raw and "</think>" not in raw  # random weights never close the block the prompt opened
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n"))
    assert main(argv) == 0
    out = capsys.readouterr()
    assert out.out.strip() == ""  # all of it was reasoning: none on stdout
    assert raw.split()[0] in out.err  # but on stderr
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n"))
    assert main([*argv, "--chat-template-kwargs", '{"enable_thinking": false}']) == 0
    assert capsys.readouterr().out.strip()  # the template wrote an empty block: the output is the answer, on stdout
    assert main([*argv, "--chat-template-kwargs", "[1]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--chat-template-kwargs must be a JSON object" in err
