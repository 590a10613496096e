"""Threads per rank: `auto` resolved in the renderers (OMP_NUM_THREADS, Slurm, MPIJob) and in
the ranks (toolkit.cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from toolkit.cores import core_share, threads_in_rank, threads_per_rank, usable_cores
from toolkit.render.launchers import LaunchContext, launch_plan
from toolkit.render.layout import rank_layout, ranks_per_host
from toolkit.render.mpijob import mpijob_manifest
from toolkit.render.slurm import sbatch_script
from toolkit.spec import SpecError, TrainSpec

CONTEXT = LaunchContext(uid=1000, cpu_count=2, python="python")


def spec(launch: dict[str, Any], backend: str = "ddp") -> TrainSpec:
    return TrainSpec.from_dict({"backend": backend, "launch": launch})


def test_auto_shares_the_cores_evenly_and_never_gives_less_than_one() -> None:
    assert threads_per_rank("auto", ranks_on_host=2, cores=16) == 8
    assert threads_per_rank("auto", ranks_on_host=3, cores=16) == 5
    assert threads_per_rank("auto", ranks_on_host=4, cores=2) == 1
    assert threads_per_rank(3, ranks_on_host=4, cores=2) == 3


def test_a_rank_takes_the_number_written_then_its_launch_then_its_share() -> None:
    assert threads_in_rank(3, 2, {"OMP_NUM_THREADS": "7"}) == 3
    assert threads_in_rank("auto", 2, {"OMP_NUM_THREADS": "7"}) == 7
    share = max(1, usable_cores() // 2)
    assert threads_in_rank("auto", 2, {}) == share
    assert threads_in_rank("auto", 2, {"OMP_NUM_THREADS": "lots"}) == share


def test_the_launch_renders_auto_for_the_busiest_host_of_this_machine() -> None:
    plan = launch_plan(spec({"np": 2}), ["train.py"], CONTEXT)
    assert plan.env["OMP_NUM_THREADS"] == str(max(1, usable_cores() // 2))
    one = launch_plan(spec({"np": 1}), ["train.py"], CONTEXT)
    assert one.env["OMP_NUM_THREADS"] == str(usable_cores())
    uneven = {"launcher": "mpirun", "hosts": ["n1:3", "n2:1"]}
    plan = launch_plan(spec(uneven), ["train.py"], CONTEXT)
    assert plan.env["OMP_NUM_THREADS"] == str(max(1, usable_cores() // 3))
    written = launch_plan(spec({"np": 2, "threads_per_rank": 5}), ["train.py"], CONTEXT)
    assert written.env["OMP_NUM_THREADS"] == "5"


@pytest.mark.parametrize(("setting", "expected"), [("auto", "1"), (3, "3")])
def test_cluster_jobs_take_auto_as_one_cpu_per_rank(setting: Any, expected: str) -> None:
    under_slurm = spec({"launcher": "srun", "np": 2, "threads_per_rank": setting})
    srun = launch_plan(under_slurm, ["train.py"], CONTEXT)
    assert srun.argv is not None and f"--cpus-per-task={expected}" in srun.argv
    assert srun.env["OMP_NUM_THREADS"] == expected
    batch = sbatch_script(under_slurm, ["t.py"])
    assert f"#SBATCH --cpus-per-task={expected}" in batch
    assert f"export OMP_NUM_THREADS={expected}" in batch
    hosts = {"launcher": "mpirun", "hosts": ["w0:2", "w1:2"], "threads_per_rank": setting}
    manifest = mpijob_manifest(spec(hosts, backend="horovod"), ["t.py"])
    launcher = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    env = {item["name"]: item["value"] for item in launcher["containers"][0]["env"]}
    assert env["OMP_NUM_THREADS"] == expected


@pytest.mark.parametrize("value", ["many", 0, -1, 2.5, True])
def test_threads_must_be_a_positive_count_or_auto(value: Any) -> None:
    with pytest.raises(SpecError) as caught:
        spec({"threads_per_rank": value})
    assert "launch.threads_per_rank" in str(caught.value)


@pytest.mark.parametrize(
    "launch",
    [
        {"np": 2},
        {"launcher": "mpirun", "hosts": ["n1:3", "n2:1"]},
        {"launcher": "mpirun", "hosts": ["n1:3", "n2:1"], "np": 3},
        {"launcher": "mpirun", "hosts": ["n1:1", "n2:2"], "np": 9},
        {"launcher": "mpirun", "hosts": ["n1:2", "n2:2", "n3:1"], "np": 12},
    ],
)
def test_ranks_per_host_are_counted_as_the_layout_places_ranks(launch: dict[str, Any]) -> None:
    placed = spec(launch)
    counts = ranks_per_host(placed)
    # Counted apart from the layout's own order of nodes, which assigns each rank its host.
    placed_on = Counter(slot.node for slot in rank_layout(placed))
    assert counts == [placed_on[node] for node in range(len(counts))]
    assert max(counts) == max(slot.local_size for slot in rank_layout(placed))


def test_each_rank_binds_to_an_even_contiguous_share_of_the_cores() -> None:
    cores = [0, 1, 2, 3, 4, 5, 6]  # 7 cores, 3 ranks: 2 each, core 6 unused
    assert [core_share(cores, rank, 3) for rank in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert core_share([5, 3], 1, 2) == [5]  # in order, whatever order they came in
    # More ranks than cores: they share, round the cores
    assert [core_share([0, 1], rank, 3) for rank in range(3)] == [[0], [1], [0]]
    # Inside a binding the launcher made: a rank given one core keeps it
    assert core_share([6], 1, 2) == [6]


def test_binding_a_process_binds_the_threads_it_has_started() -> None:
    """Run in a child process: binding this test's own process would outlive the test."""
    program = (
        "import os, threading, json\n"
        "from toolkit.cores import bind_rank\n"
        "stop = threading.Event()\n"
        "early = threading.Thread(target=stop.wait); early.start()\n"
        "bind_rank(True, 1, 2)\n"
        "late = threading.Thread(target=stop.wait); late.start()\n"
        "tasks = os.listdir('/proc/self/task')\n"
        "print(json.dumps({t: sorted(os.sched_getaffinity(int(t))) for t in tasks}))\n"
        "stop.set()\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    masks = json.loads(done.stdout)
    expected = core_share(sorted(os.sched_getaffinity(0)), 1, 2)
    assert len(masks) == 3 and all(mask == expected for mask in masks.values()), masks
    no = subprocess.run(
        [
            sys.executable,
            "-c",
            "from toolkit.cores import bind_rank; bind_rank(False, 1, 2)\n"
            "import os; print(len(os.sched_getaffinity(0)))",
        ],
        capture_output=True,
        text=True,
    )
    assert int(no.stdout) == len(os.sched_getaffinity(0)), no.stderr
