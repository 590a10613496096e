"""`launch.malloc`: every launcher gives the ranks the allocator's settings, and glibc applies
them in a rank started by a real launcher (toolkit/render/malloc.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolkit.render.launchers import LaunchContext, launch_plan
from toolkit.render.malloc import KEEP_FREED_MEMORY
from toolkit.spec import SpecError, TrainSpec

BIN = Path(sys.executable).parent
CONTEXT = LaunchContext(uid=1000, cpu_count=2, python=sys.executable)
LAUNCHERS = {
    "horovodrun": {"backend": "horovod"},
    "mpirun": {"backend": "horovod", "horovod": {"controller": "mpi"}},
    "deepspeed": {"backend": "deepspeed"},
    "torchrun": {"backend": "ddp"},
    "srun": {"backend": "ddp"},
    "local": {"backend": "tf"},
}

# Each small round allocates 24 blocks of 1 MiB, writes them and frees them all. With glibc's
# own settings the first free raises the mmap threshold to 1 MiB and the trim threshold to 2
# MiB, so later blocks come from the heap and freeing them trims its 24 MiB top away: every
# round page-faults the 24 MiB in again. Each large round does the same with one 64 MiB block,
# above any mmap threshold glibc allows: its own settings map it afresh every time. Kept (no
# block mapped on its own, no trimming), the heap's pages serve every round of both.
ROUNDS_SCRIPT = """
import ctypes, json, os, resource
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def round_(count, size):
    blocks = [libc.malloc(size) for _ in range(count)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
def faults_per_round(count, size):
    round_(count, size)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        round_(count, size)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
print(json.dumps({"rank": os.environ["RANK"], "tunables": os.environ.get("GLIBC_TUNABLES"),
                  "small": faults_per_round(24, 1 << 20), "large": faults_per_round(1, 64 << 20)}),
      flush=True)
"""


def rank_env(data: dict[str, Any], launcher: str) -> dict[str, str]:
    """What rank 0 of `data` gets from the toolkit under `launcher`: the launcher's variables,
    which it forwards to every rank, and the rank's own."""
    launch = {"launcher": launcher, "np": 2, **data.get("launch", {})}
    spec = TrainSpec.from_dict({**data, "launch": launch})
    plan = launch_plan(spec, ["train.py"], CONTEXT)
    return {**plan.env, **plan.ranks[0].env}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_every_launcher_gives_the_ranks_the_allocators_settings(launcher: str) -> None:
    data = LAUNCHERS[launcher]
    assert rank_env(data, launcher)["GLIBC_TUNABLES"] == KEEP_FREED_MEMORY
    assert "GLIBC_TUNABLES" not in rank_env({**data, "launch": {"malloc": "glibc"}}, launcher)
    own = {"launch": {"env": {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"}}}
    assert rank_env({**data, **own}, launcher)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=1"


def test_malloc_rejects_other_values_naming_the_field() -> None:
    with pytest.raises(SpecError, match=r"launch\.malloc"):
        TrainSpec.from_dict({"launch": {"malloc": "jemalloc"}})


@pytest.mark.multiproc
@pytest.mark.usefixtures("no_orphans")
def test_glibc_keeps_freed_memory_in_ranks_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "rounds.py"
    script.write_text(ROUNDS_SCRIPT)
    faults = {}
    for setting in ("keep", "glibc"):
        spec = tmp_path / f"{setting}.yaml"
        spec.write_text(f"backend: ddp\nlaunch: {{launcher: torchrun, np: 2, malloc: {setting}}}\n")
        argv = [str(BIN / "toolkit"), "launch", "--spec", str(spec), "--timeout", "120"]
        done = subprocess.run(
            [*argv, "--", str(script)], capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stdout + done.stderr
        reports = [json.loads(line) for line in done.stdout.splitlines() if '"rank"' in line]
        assert sorted(r["rank"] for r in reports) == ["0", "1"], done.stdout
        faults[setting] = {size: max(r[size] for r in reports) for size in ("small", "large")}
        expected = KEEP_FREED_MEMORY if setting == "keep" else None
        assert all(r["tunables"] == expected for r in reports), reports
    # 24 MiB is 6,144 pages, 64 MiB 16,384: glibc's own settings fault most of them in every
    # round.
    assert faults["glibc"]["small"] > 3000 and faults["glibc"]["large"] > 10000, faults
    assert faults["keep"]["small"] < 100 and faults["keep"]["large"] < 100, faults
