"""A stopped rank ends the job under every engine and launcher, for real.

Each case trains a small model with a real engine under `toolkit launch` and its real
launcher, stops rank 1 with SIGSTOP once training is under way, and checks that the job ends by
itself within the spec's `timeouts.stall_s` plus a generous contract bound, with the launch's
timeout status (124), a report naming rank 1 and its host, and no process left behind. The
other rank is then blocked in the engine's next collective and must not spin a core meanwhile:
its CPU share over 3 s is held to a generous bound (a waiting loop that sleeps uses a few
percent; a spinning one 70-95%). Exempt, as the engines wait by design (docs/engine-notes.md):
Horovod's MPI controller, whose background thread waits in Open MPI's progress engine, and
Horovod torch's `synchronize`, which waits in a `sched_yield` loop; the job still ends at
`stall_s`.

By default a representative subset runs: every engine once and every launcher `toolkit launch`
drives on one host once. `TOOLKIT_FAULTS=full` runs every (engine, launcher) pair the engine
table allows on one host (srun needs an allocation: tests/cluster covers it).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.options import FULL_FAULTS
from tests.realrun import SPECS, rank_env
from tests.supervised import CONTRACT_SECONDS, gone, start_training_job, wait_for_ranks
from toolkit.engines import engine
from toolkit.ports import free_port, free_port_range

pytestmark = [pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]

HOST = socket.gethostname()
STALL_SECONDS = 8.0
UP_SECONDS = 240.0
"""Engines start slowly on a busy 2-core machine (TensorFlow and DeepSpeed most)."""
SINGLE_HOST_LAUNCHERS = ("local", "torchrun", "mpirun", "horovodrun", "deepspeed")
WAITING_CPU_BOUND = 0.5
"""Share of a core a rank waiting on a stopped peer may use; spinning is 0.7-1.0."""
BUSY_POLLING = {"horovod-torch", ("horovod-tf", "mpirun")}
"""Engines whose waits poll: Horovod torch under every launcher, and Horovod TF under mpirun,
where its controller is MPI's (`write_spec`)."""

# engine label -> the example spec it starts from
ENGINE_SPECS = {
    "ddp": "ddp",
    "horovod-torch": "horovod",
    "horovod-tf": "horovod_tf",
    "zero2": "zero2",
    "pipeline": "pipeline",
    "tf-multiworker": "tf_multiworker",
}
SUBSET = [
    ("ddp", "torchrun"),
    ("horovod-torch", "horovodrun"),
    ("horovod-tf", "mpirun"),
    ("zero2", "deepspeed"),
    ("tf-multiworker", "local"),
]


def base_spec(label: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SPECS / f"{ENGINE_SPECS[label]}.yaml").read_text())
    return loaded


def allowed_pairs() -> list[tuple[str, str]]:
    pairs = []
    for label in ENGINE_SPECS:
        spec = base_spec(label)
        entry = engine(spec["backend"], spec.get("framework"))
        pairs += [(label, name) for name in entry.launchers if name in SINGLE_HOST_LAUNCHERS]
    return pairs


CASES = allowed_pairs() if FULL_FAULTS else SUBSET


def write_spec(label: str, launcher: str, directory: Path) -> Path:
    spec = base_spec(label)
    spec["launch"] = {"launcher": launcher, "np": 2, "master_port": free_port()}
    spec["timeouts"] = {"stall_s": STALL_SECONDS, "collective_s": 600}
    if "horovod" in spec:
        # Under mpirun the controller follows the launcher (MPI). Under horovodrun it would
        # follow the machine (MPI where Horovod has it), whose waits are Open MPI's, covered
        # under mpirun; so horovodrun runs Gloo's.
        spec["horovod"].pop("controller", None)
        if launcher == "horovodrun":
            spec["horovod"]["controller"] = "gloo"
    if "tf" in spec:
        spec["tf"]["port"] = free_port_range(2)
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def survivor_cpu(pid: int, seconds: float = 3.0) -> float:
    """Share of one core the rank used over `seconds` (1.0 = a core spinning)."""
    process = psutil.Process(pid)
    before = sum(process.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(process.cpu_times()[:2]) - before) / seconds


@pytest.mark.parametrize(
    ("label", "launcher"), CASES, ids=[f"{label}-{name}" for label, name in CASES]
)
def test_stopped_rank_ends_the_job(label: str, launcher: str, tmp_path: Path) -> None:
    spec = write_spec(label, launcher, tmp_path)
    job, piddir, log = start_training_job(spec, tmp_path, rank_env())
    try:
        ranks = wait_for_ranks(piddir, bound=UP_SECONDS, job=job, log=log)
        tree = psutil.Process(job.pid).children(recursive=True)
        os.kill(ranks[1], signal.SIGSTOP)
        stopped_at = time.monotonic()
        cpu = survivor_cpu(ranks[0])
        returncode = job.wait(timeout=STALL_SECONDS + CONTRACT_SECONDS)
        ended_after = time.monotonic() - stopped_at
    finally:
        job.kill()
        job.wait()
    output = log.read_text()
    print(f"{label} under {launcher}: ended {ended_after:.1f} s after SIGSTOP; survivor {cpu:.0%}")
    assert returncode == 124, output[-3000:]
    assert f"rank 1 on host {HOST} stalled (no heartbeat for " in output, output[-3000:]
    if label not in BUSY_POLLING and (label, launcher) not in BUSY_POLLING:
        assert cpu < WAITING_CPU_BOUND, f"the waiting rank used {cpu:.0%} of a core"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(gone(p.pid) for p in tree):
        time.sleep(0.1)
    assert all(gone(p.pid) for p in tree), [p.pid for p in tree if not gone(p.pid)]
