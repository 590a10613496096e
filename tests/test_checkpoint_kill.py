"""A save killed (SIGKILL) at any moment, on any rank, leaves `latest` on a complete checkpoint,
and the next save leaves no temporary files behind. Real processes, real files."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from toolkit.checkpoint import CheckpointState, latest, read_checkpoint, write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120

# One rank of a save. In "loop" mode it saves steps FIRST, FIRST+1, ... (about MB megabytes
# each, keep=2) and prints "committed N seconds" after each. In "point" mode it is rank RANK
# of RANKS processes saving step FIRST once (file barrier, then rank 0 commits), and the rank
# named KILL_RANK kills itself with SIGKILL at the named POINT of the save.
CHILD = r"""
import os, signal, sys, time
from pathlib import Path
import numpy as np
import toolkit.checkpoint.write as saving
from toolkit.checkpoint import layout
from toolkit.checkpoint.state import CheckpointState

mode, root, rank, ranks, first, mb, point, kill_rank = sys.argv[1:9]
root, rank, ranks, first, mb, kill_rank = Path(root), *map(int, (rank, ranks, first, mb, kill_rank))

def state_for(step, elements):
    model = {f"w{i}": np.full(elements, step + i, np.float32) for i in range(4)}
    optimizer = {f"{slot}/w{i}": np.full(elements, -step - i, np.float32)
                 for slot in ("exp_avg", "exp_avg_sq") for i in range(4)}
    return CheckpointState(step=step, model=model, optimizer=optimizer, extras={"step": step},
                           arrays={"rng/rank0": np.arange(624, dtype=np.uint32) + step})

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def wrap_rename(before):
    real = os.rename
    def rename(src, dst):
        if not Path(src).name.startswith(".incomplete-"):
            return real(src, dst)
        if before:
            die()
        real(src, dst)
        die()
    return rename

def wrap_after(function):
    def call(*args, **kwargs):
        function(*args, **kwargs)
        die()
    return call

HOOKS = {
    "shard-written": lambda: setattr(saving.PendingSave, "finish", die),
    "before-manifest": lambda: setattr(saving, "checksum_line", die),
    "before-rename": lambda: setattr(os, "rename", wrap_rename(before=True)),
    "after-rename": lambda: setattr(os, "rename", wrap_rename(before=False)),
    "before-latest": lambda: setattr(layout, "write_pointer", die),
    "during-rotation": lambda: setattr(layout.shutil, "rmtree", die),
    "replacing": lambda: setattr(layout, "discard", wrap_after(layout.discard)),
}

def barrier(name):
    (root.parent / f"{name}-{rank}").touch()
    deadline = time.monotonic() + 60
    while not all((root.parent / f"{name}-{r}").exists() for r in range(ranks)):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.01)

elements = mb * 1024 * 1024 // 4 // 12
if mode == "loop":
    step = first
    while True:
        started = time.monotonic()
        saving.write_checkpoint(root, state_for(step, elements), keep=2)
        print(f"committed {step} {time.monotonic() - started:.3f}", flush=True)
        step += 1
if rank == kill_rank:
    HOOKS[point]()
state = state_for(first, elements)
pending = saving.begin_save(root, first, rank=rank, ranks=ranks)
if rank == 0:
    pending.write("model", state.model, whole=True)
pending.write("optimizer", {k: v for i, (k, v) in enumerate(sorted(state.optimizer.items()))
                            if i % ranks == rank})
pending.write("arrays", {f"rng/rank{rank}": state.arrays["rng/rank0"]})
pending.finish()
barrier(f"finished-{first}")
if rank == 0:
    saving.commit_save(root, first, ranks=ranks, extras=state.extras, keep=1)
"""


def state_for(step: int, elements: int) -> CheckpointState:
    """The parent's own saves: the child's layout at a small size."""
    model = {f"w{i}": np.full(elements, step + i, np.float32) for i in range(4)}
    return CheckpointState(step=step, model=model, extras={"step": step})


def child(mode: str, root: Path, *, rank: int = 0, ranks: int = 1, first: int, mb: int = 1,
          point: str = "-", kill_rank: int = -1) -> subprocess.Popen[str]:  # fmt: skip
    argv = [sys.executable, "-c", CHILD, mode, str(root), str(rank), str(ranks), str(first)]
    return subprocess.Popen(
        [*argv, str(mb), point, str(kill_rank)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )


def assert_latest_is_complete(root: Path) -> int:
    """`latest` loads, every tensor agrees with the manifest's step; returns that step."""
    state = read_checkpoint(root)
    assert state.extras["step"] == state.step
    for i in range(4):
        assert np.all(state.model[f"w{i}"] == state.step + i)
    for name, value in state.optimizer.items():
        assert np.all(value == -state.step - int(name[-1])), name
    return state.step


def assert_no_leftovers(root: Path) -> None:
    hidden = [p.name for p in root.iterdir() if p.name.startswith(".")]
    assert hidden == [], hidden


def test_killed_at_random_moments_of_50_mb_saves(tmp_path: Path, no_orphans: None) -> None:
    root = tmp_path / "ckpt"
    rng = random.Random(20240611)
    step = 1
    kills_mid_save = 0
    for _ in range(6):
        process = child("loop", root, first=step, mb=50)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("committed"), process.communicate(timeout=TIMEOUT_S)[1]
        committed, seconds = int(line.split()[1]), float(line.split()[2])
        time.sleep(rng.uniform(0, 2.5 * seconds))
        process.send_signal(signal.SIGKILL)
        out, err = process.communicate(timeout=TIMEOUT_S)
        assert process.returncode == -signal.SIGKILL, err
        printed = [committed, *(int(line.split()[1]) for line in out.splitlines())]
        kills_mid_save += any(p.name.startswith(".") for p in root.iterdir())
        # The kill may land after the commit of the next step but before its line is printed.
        assert assert_latest_is_complete(root) in (printed[-1], printed[-1] + 1)
        step = read_checkpoint(root).step + 1
        write_checkpoint(root, state_for(step, 1000), keep=2)
        assert_no_leftovers(root)
        assert assert_latest_is_complete(root) == step
        assert len(list(root.glob("step-*"))) == 2
        step += 1
    assert kills_mid_save > 0, "no kill landed inside a save; the test proved nothing"


@pytest.mark.parametrize(
    ("point", "kill_rank", "expected_step"),
    [
        ("shard-written", 1, 1),
        ("shard-written", 0, 1),
        ("before-manifest", 0, 1),
        ("before-rename", 0, 1),
        ("after-rename", 0, 1),
        ("before-latest", 0, 1),
        ("during-rotation", 0, 2),
        ("replacing", 0, 1),
    ],
)
def test_killed_at_named_points_of_a_two_rank_save(
    tmp_path: Path, no_orphans: None, point: str, kill_rank: int, expected_step: int
) -> None:
    root = tmp_path / "ckpt"
    write_checkpoint(root, state_for(1, 1000))
    saving_step = 2
    if point == "replacing":  # step 2 exists and is latest; it is being saved again
        write_checkpoint(root, state_for(2, 1000))
    ranks = [
        child("point", root, rank=r, ranks=2, first=saving_step, point=point, kill_rank=kill_rank)
        for r in range(2)
    ]
    ranks[kill_rank].wait(timeout=TIMEOUT_S)
    for process in ranks:  # the survivor may be waiting at the barrier for the dead rank
        if process.poll() is None:
            process.kill()
        errors = process.communicate(timeout=TIMEOUT_S)[1]
    assert ranks[kill_rank].returncode == -signal.SIGKILL, errors
    assert latest(root) is not None
    assert assert_latest_is_complete(root) == expected_step
    write_checkpoint(root, state_for(10, 1000), keep=2)
    assert_no_leftovers(root)
    assert assert_latest_is_complete(root) == 10
    assert len(list(root.glob("step-*"))) == 2


FULL_DISK = r"""
import resource, signal, sys
import numpy as np
from toolkit.checkpoint import CheckpointState, write_checkpoint
from toolkit.errors import ToolkitError

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1024 * 1024, resource.RLIM_INFINITY))
model = {f"w{i}": np.full(2**19, 2 + i, np.float32) for i in range(4)}
state = CheckpointState(step=2, model=model)
try:
    write_checkpoint(sys.argv[1], state)
except ToolkitError as error:
    print(error)
"""


def test_a_failed_write_is_one_clear_error_and_changes_nothing(tmp_path: Path) -> None:
    """A real failing write (the file-size limit stands in for a full disk)."""
    root = tmp_path / "ckpt"
    write_checkpoint(root, state_for(1, 1000))
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(root)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert "cannot write checkpoint file" in done.stdout, done.stdout + done.stderr
    assert "model.safetensors: File too large" in done.stdout
    assert assert_latest_is_complete(root) == 1
    write_checkpoint(root, state_for(3, 1000))
    assert_no_leftovers(root)
