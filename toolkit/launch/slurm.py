"""Slurm's compressed lists, as srun writes them into each task's environment.

Host lists ("gpu[01-03,07],cpu1") name the step's nodes; tasks-per-node lists ("2(x3),1")
say how many tasks each of those nodes runs, in the same order.
"""

from __future__ import annotations

import re

from toolkit.errors import ToolkitError

_HINT = "srun writes this variable itself; unset any value exported by hand"
_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_hostlist(text: str, source: str = "SLURM_JOB_NODELIST") -> tuple[str, ...]:
    """Expand a host list: "gpu[01-03,07],cpu1" -> gpu01, gpu02, gpu03, gpu07, cpu1. Zero
    padding is kept; several bracket groups in one name expand to their product. `source`
    names the variable in errors."""
    items, depth, start = [], 0, 0
    for position, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            break
        if char == "," and depth == 0:
            items.append(text[start:position])
            start = position + 1
    items.append(text[start:])
    if depth != 0 or not all(items):
        raise ToolkitError(f"{source}={text!r} is not a Slurm host list.", _HINT)
    return tuple(host for item in items for host in _expand_brackets(item, text, source))


def _expand_brackets(name: str, text: str, source: str) -> list[str]:
    opening = name.find("[")
    if opening < 0:
        return [name]
    closing = name.index("]", opening)
    suffixes = _expand_brackets(name[closing + 1 :], text, source)
    values: list[str] = []
    for part in name[opening + 1 : closing].split(","):
        low, dash, high = part.partition("-")
        high = high if dash else low
        if not low.isdigit() or not high.isdigit() or int(high) < int(low):
            raise ToolkitError(f"{source}={text!r} has a bad range {part!r}.", _HINT)
        values += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return [name[:opening] + value + suffix for value in values for suffix in suffixes]


def expand_tasks_per_node(text: str, source: str) -> list[int]:
    """Expand a tasks-per-node list: "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if not match:
            raise ToolkitError(
                f"{source}={text!r} is not a Slurm tasks-per-node list like '2(x3),1'.", _HINT
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts
