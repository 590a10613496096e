"""What every bench command writes: a JSON file of its figures, a short Markdown table beside
it, and the machine the figures were measured on."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """What the figures depend on: the cores this process may use, the CPU, the Python."""
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
    }


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def write(
    out: Path, name: str, figures: dict[str, Any], header: Sequence[str], rows: list[list[str]]
) -> None:
    """OUT/NAME.json (the figures, the machine and the command) and OUT/NAME.md (the table),
    and the table on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": ["toolkit", *sys.argv[1:]], "machine": machine(), **figures}
    (out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    command = " ".join(record["command"])
    details = record["machine"]
    caption = f"`{command}` on {details['cores']} cores ({details['cpu']}), {details['date']}.\n\n"
    (out / f"{name}.md").write_text(caption + markdown_table(header, rows))
    print(text_table(header, rows))
    print(f"wrote {out / name}.json and {name}.md")


def milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def mebibytes(value: float | None) -> str:
    return "-" if value is None else f"{value / (1 << 20):.0f}"
