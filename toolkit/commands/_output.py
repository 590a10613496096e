"""Helpers shared by the config, spec and launch commands: where output goes, the spec path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkit.errors import ToolkitError


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")


def add_spec(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, metavar="FILE", help="the spec (YAML or JSON)")


def positive_ranks(text: str) -> int:
    """argparse type: a whole number of ranks, at least 1."""
    if not (text.isascii() and text.isdigit() and len(text) <= 6 and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"must be a whole number of ranks >= 1, not {text[:20]!r}")
    return int(text)


def emit(text: str, output: str | None) -> None:
    """Print `text`, or write it to `output`."""
    if not text.endswith("\n"):
        text += "\n"
    if output is None:
        sys.stdout.write(text)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as error:
        raise ToolkitError(
            f"cannot write {output}: {error.strerror or error}", hint="check the -o path"
        ) from None


def warn(message: str) -> None:
    print(f"toolkit: warning: {message}", file=sys.stderr)
