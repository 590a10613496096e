"""Command line: argv -> the right command module. Imports no engine.

Each subcommand lives in `toolkit/commands/<name>.py` and exposes `register(subparsers)`, which
adds its parser and sets `func`. Adding a command is one new module and one entry in COMMANDS.

Only the module of the command being run is imported (the others get a placeholder parser that
shows their summary in `toolkit --help`): `toolkit doctor` must work, and say what is missing,
in an environment where nothing but the standard library is installed.

A `ToolkitError` becomes one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from toolkit import __version__
from toolkit.errors import ToolkitError

COMMANDS = {
    "doctor": "check that the engines and launchers are installed and work together",
    "config": "render an engine's or launcher's configuration from a spec",
    "spec": "check, show or import (from a DeepSpeed config) a spec",
    "launch": "start a job under the spec's launcher (or --dry-run to see it)",
    "parity": "prove every engine trains the same model to the same weights",
    "bench": "measure the toolkit's step and collectives against the native engines",
    "plan": "per-rank memory, communication and pipeline bubble for every engine",
}
USER_ERROR_EXIT = 2


def build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolkit",
        description="One training script and one spec on Horovod, DeepSpeed, tf.distribute, DDP.",
    )
    parser.add_argument("--version", action="version", version=f"toolkit {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in COMMANDS.items():
        if name == command:
            importlib.import_module(f"toolkit.commands.{name}").register(subparsers)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in args_list if arg in COMMANDS), None)
    args = build_parser(command).parse_args(args_list)
    try:
        return int(args.func(args))
    except ToolkitError as error:
        print(f"toolkit: error: {error.one_line()}", file=sys.stderr)
        return USER_ERROR_EXIT
    except KeyboardInterrupt:
        print("toolkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
