"""Tasks started by srun, and Slurm's compressed lists that describe them.

Host lists ("gpu[01-03,07],cpu1") name the step's nodes; tasks-per-node lists ("2(x3),1")
say how many tasks each of those nodes runs, in the same order. `SlurmVariables` is the srun
detector: the generic variable reader plus these lists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from toolkit.errors import ToolkitError
from toolkit.launch.detectors import STALE_HINT, Variables, parse_int

_HINT = "srun writes this variable itself; unset any value exported by hand"
_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def allocation_tasks(environ: Mapping[str, str]) -> int | None:
    """Tasks of the Slurm allocation this process runs in (salloc, or an sbatch script), from
    SLURM_NTASKS (SLURM_NPROCS on old Slurm); None outside an allocation or when it was made
    without a task count."""
    if "SLURM_JOB_ID" not in environ:
        return None
    text = environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or ""
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else None


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


# Slurm reserves the top step ids for pseudo-steps (batch, extern, interactive), which are not a
# task launch by srun.
_SLURM_PSEUDO_STEP_IDS = 0xFFFFFFF0


@dataclass(frozen=True, kw_only=True)
class SlurmVariables(Variables):
    """Tasks started by `srun`. SLURM_PROCID alone does not mean srun: the batch step of an
    sbatch script and a bare salloc shell also carry SLURM_PROCID=0 and, with --ntasks,
    SLURM_NTASKS, so a plain `python train.py` in a batch script would wait forever for ranks
    that were never started. Only srun sets SLURM_STEP_ID (a marker), and only to a real step
    id. The tasks on this node come from compressed per-node lists and the hosts from a host
    list; the step's own are preferred over the job's, which differ when a step uses part of
    the allocation."""

    def claims(self, env: Mapping[str, str]) -> bool:
        step = env[self.markers[0]].strip()
        return step.isdigit() and int(step) < _SLURM_PSEUDO_STEP_IDS

    def _local_size(self, env: Mapping[str, str], node_rank: int | None) -> tuple[str, int]:
        """Tasks on this node from the step's tasks-per-node list ("2(x3),1" means 2,2,2,1)."""
        assert node_rank is not None  # SLURM_NODEID is required
        for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if env.get(name):
                counts = expand_tasks_per_node(env[name], name)
                if node_rank >= len(counts):
                    raise ToolkitError(
                        f"{self.node_rank}={node_rank} has no entry in {name}={env[name]!r}.",
                        STALE_HINT,
                    )
                return name, counts[node_rank]
        if env.get("SLURM_NTASKS_PER_NODE"):
            return "SLURM_NTASKS_PER_NODE", parse_int(env, "SLURM_NTASKS_PER_NODE")
        raise ToolkitError(
            "srun set none of SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, "
            "SLURM_NTASKS_PER_NODE: the number of tasks on this node is unknown.",
            "start the job with srun --ntasks-per-node=N",
        )

    def _hosts(self, env: Mapping[str, str]) -> tuple[str, ...]:
        for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"):
            if env.get(name):
                return expand_hostlist(env[name], name)
        return ()
