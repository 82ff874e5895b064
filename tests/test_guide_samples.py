"""docs/guide.md's sample outputs are what the current CLI prints (scripts/guide_samples.py writes them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_server_support import REPO


@pytest.mark.slow
def test_the_guide_samples_are_up_to_date() -> None:
    done = subprocess.run([sys.executable, "scripts/guide_samples.py", "--check"], cwd=REPO, capture_output=True,
                          text=True, timeout=900)  # a bound on a hang
    assert done.returncode == 0, done.stdout + done.stderr
