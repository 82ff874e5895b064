"""Mistakes in the arguments are one line naming the flag, and exit 2 (no usage block, no traceback)."""

from __future__ import annotations

import pytest

from stagewise.cli.main import main

CASES = [
    (["run", "--context", "abc"], "argument --context: invalid int value: 'abc'"),
    (["run", "--context", "1e9"], "argument --context: invalid int value: '1e9'"),
    (["serve", "--max-seqs", "abc"], "argument --max-seqs: expected a number or auto, got 'abc'"),
    (["devices", "--reserve", "-5GiB"], "--reserve"),
    (["devices", "--devices", "-24GiB"], "--devices entry 0 ('-24GiB')"),
    (["serve", "random:tiny-llama", "--reserve", "-5GiB"], "--reserve"),  # before it listens, not after
    (["serve", "random:tiny-llama", "--devices", "cuda:0x"], "--devices entry 0 ('cuda:0x')"),
    (["run", "-p", "hello", "--chat", "hi"], "argument --chat: not allowed with argument -p/--prompt"),
    (["frob"], "argument COMMAND: invalid choice: 'frob'"),
    (["run", "--prompt-tokens", ""], "argument --prompt-tokens: expected comma-separated token ids"),
    (["run", "--prompt-tokens", "1,x"], "argument --prompt-tokens: expected comma-separated token ids"),
    (["bench", "random:tiny-qwen3", "--prompt", "0"], "argument --prompt: expected a whole number >= 1, got '0'"),
    (["bench", "random:tiny-qwen3", "--gen", "-3"], "argument --gen: expected a whole number >= 1, got '-3'"),
]


@pytest.mark.parametrize(("argv", "says"), CASES, ids=[" ".join(a) or "empty" for a, _ in CASES])
def test_one_line_and_exit_2(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit
        code = exc.code  # type: ignore[assignment]
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert code == 2 and not out.out, out
    assert len(lines) == 1 and lines[0].startswith("stagewise: error: ") and says in lines[0], lines


def test_a_negative_size_is_named_as_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--reserve", "-5GiB"]) == 2
    assert "must not be negative, got '-5GiB'" in capsys.readouterr().err


def test_a_value_that_is_a_flag_stays_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "m.json", "--devices", "--json"])  # --json is plan's own flag: --devices has no value
    assert info.value.code == 2
    assert "argument --devices: expected one argument" in capsys.readouterr().err
