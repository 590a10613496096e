"""Command line: argv -> the right command module. Imports no engine.

Each subcommand lives in `toolkit/commands/<name>.py` and exposes `register(subparsers)`, which
adds its parser and sets `func`. Adding a command is one new module and one entry in COMMANDS.

Only the module of the command being run is imported (the others get a placeholder parser that
shows their summary in `toolkit --help`): `toolkit doctor` must work, and say what is missing,
in an environment where nothing but the standard library is installed.

Exit statuses: 0 success; 1 a check that found something (`config presets --check`) or a job
that failed (`toolkit launch` documents its own); 2 a user error: one line on stderr saying what
to change, never a traceback; 70 a bug in the toolkit: one line saying so and where the full
traceback was written; 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from toolkit import __version__
from toolkit.cache import cache_directory
from toolkit.errors import ToolkitError

COMMANDS = {
    "doctor": "check that the engines and launchers are installed and work together",
    "config": "render an engine's or launcher's configuration from a spec",
    "spec": "check or show a spec, print its JSON Schema, import a DeepSpeed config",
    "launch": "start a job under the spec's launcher (or --dry-run to see it)",
    "parity": "prove every engine trains the same model to the same weights",
    "checkpoint": "inspect a checkpoint, or export its weights for inference",
    "bench": "measure the toolkit's step and collectives against the native engines",
    "plan": "per-rank memory, communication and pipeline bubble for every engine",
}
USER_ERROR_EXIT = 2
BUG_EXIT = 70
"""EX_SOFTWARE of sysexits.h: an internal error."""
INTERRUPTED_EXIT = 130


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
        return INTERRUPTED_EXIT
    except BrokenPipeError:
        # The reader of our output went away (`toolkit spec show x | head -1`): not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:  # the last resort: whatever it is, it is our bug
        where = write_crash_report(args_list)
        summary = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        print(
            f"toolkit: internal error (a bug in the toolkit, not in your input): {summary}; "
            f"the full traceback is in {where}",
            file=sys.stderr,
        )
        return BUG_EXIT


def crash_directory() -> Path:
    """Where crash reports go: ~/.cache/toolkit/logs (XDG_CACHE_HOME honoured)."""
    return cache_directory() / "logs"


def write_crash_report(argv: Sequence[str]) -> str:
    """Write the exception being handled, with the command line, to a new file; its path (or
    a note that none could be written)."""
    text = (
        f"toolkit {__version__}, Python {sys.version.split()[0]}\n"
        f"argv: {list(argv)!r}\n\n{traceback.format_exc()}"
    )
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    for directory in (crash_directory(), Path(tempfile.gettempdir())):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / name
            path.write_text(text, encoding="utf-8")
            return str(path)
        except OSError:
            continue
    return "(nowhere: no writable cache or temporary directory)"


if __name__ == "__main__":
    sys.exit(main())
