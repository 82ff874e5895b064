"""The ``stagewise`` command line: one subcommand per module ``stagewise.cli.cmd_<name>``.

Each command module exposes ``register(subparsers) -> None`` (adds its parser and sets
``func``) and a ``run(args) -> int``. Typed :class:`StagewiseError` s are printed as one line
on stderr and exit with their code; so are mistakes in the arguments (exit 2, the flag named, no
usage block); anything else is a bug and keeps its traceback.

Only the module of the command being run is imported (all of them for the top-level help), so the
metadata-only commands (``plan``, ``assess``) never import torch: each command module imports its
heavy dependencies itself.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from stagewise import __version__
from stagewise.errors import StagewiseError

COMMANDS = ("run", "devices", "assess", "plan", "make_model", "serve", "chat", "bench", "worker")
METADATA_ONLY = ("assess", "plan")  # commands that run no kernels (and must not import torch)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a mistake in the arguments as one line (``stagewise: error: argument --context: invalid
    int value: 'abc' (stagewise run --help)``) and exit 2, instead of the usage block before it. Its
    subcommands' parsers are of this class too (``add_subparsers`` makes them with the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"stagewise: error: {message} ({self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with only ``command`` (a name of :data:`COMMANDS`)."""
    parser = OneLineParser(
        prog="stagewise",
        description="Run LLMs as certified pipelines across the devices they need.",
    )
    parser.add_argument("--version", action="version", version=f"stagewise {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if command is None else (command,):
        try:
            module = importlib.import_module(f"stagewise.cli.cmd_{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"stagewise.cli.cmd_{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def requested_command(argv: list[str]) -> str | None:
    """The module name of the command ``argv`` starts with (``make-model`` -> ``make_model``), else None."""
    name = argv[0].replace("-", "_") if argv else ""
    return name if name in COMMANDS else None


def _simulated_devices(args: argparse.Namespace) -> bool:
    """``devices --devices SPEC`` without ``--measure`` / ``--workers`` only reads the spec (no torch;
    a spec naming real devices imports it when discovering them)."""
    return (getattr(args, "command", None) == "devices" and bool(args.devices) and not args.measure
            and not args.workers)


def _values_that_look_like_flags(parser: argparse.ArgumentParser, command: str | None, argv: list[str]) -> list[str]:
    """``argv`` with ``--flag -VALUE`` written ``--flag=-VALUE`` where ``--flag`` takes one value and ``-VALUE``
    is none of the command's flags: argparse would read ``--reserve -5GiB`` or ``--devices -24GiB`` as a
    flag and say "expected one argument"; the value's own check names what is wrong with it instead."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    name = argv[0] if argv else ""
    command_parser = subparsers[0].choices.get(name) if command is not None and subparsers else None
    if command_parser is None:
        return argv
    flags = command_parser._option_string_actions
    out = list(argv[:1])
    i = 1
    while i < len(argv):
        token = argv[i]
        action = flags.get(token)
        following = argv[i + 1] if i + 1 < len(argv) else None
        if (action is not None and action.nargs is None and action.option_strings and following is not None
                and following.startswith("-") and following not in flags and following != "--"):
            out.append(f"{token}={following}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = requested_command(argv)
    parser = build_parser(command)
    args = parser.parse_args(_values_that_look_like_flags(parser, command, argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        if command not in METADATA_ONLY and not _simulated_devices(args):
            from stagewise.kernels.kernel_env import kernels_mode, pdl_enabled  # no torch (serve's API process)

            kernels_mode()  # a bad STAGEWISE_KERNELS or STAGEWISE_PDL is the user's mistake: one line, before any work
            pdl_enabled()
        return int(args.func(args) or 0)
    except StagewiseError as exc:
        print(f"stagewise: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("stagewise: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `stagewise devices --json | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
