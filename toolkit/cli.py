"""Command line: argv -> the right command module. Imports no engine.

Each subcommand lives in `toolkit/commands/<name>.py` and exposes `register(subparsers)`, which
adds its parser and sets `func`. Adding a command is one new module and one line in COMMANDS.
A `ToolkitError` becomes one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from toolkit import __version__
from toolkit.errors import ToolkitError

COMMANDS = ("doctor", "config", "spec", "launch")
USER_ERROR_EXIT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolkit",
        description="One training script and one spec on Horovod, DeepSpeed, tf.distribute, DDP.",
    )
    parser.add_argument("--version", action="version", version=f"toolkit {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"toolkit.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
