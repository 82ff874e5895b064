"""The consoles the CLI and the server banner print through: whole lines when the output is not a terminal.

rich wraps (and cuts table cells) at 80 columns when the stream is a pipe or a file; a log, ``| grep`` or
``| less`` then gets ``devi…`` and lines broken mid-sentence. Here a stream that is not a terminal gets a
width no line reaches: tables are as wide as their content, text lines are never broken. A terminal keeps
its own width.
"""

from __future__ import annotations

import sys

from rich.console import Console

PIPE_WIDTH = 100_000  # columns: wider than any line we print, so nothing is wrapped or cut


def console(stderr: bool = False) -> Console:
    """A :class:`rich.console.Console` on stdout (or stderr) that never wraps or cuts piped output."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=PIPE_WIDTH)
