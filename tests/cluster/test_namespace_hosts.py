"""Jobs on hosts that are really apart (tests/cluster/netns.py): each host a network namespace
with its own address, loopback and sshd, so the ranks talk across the hosts' links, not over a
shared 127.0.0.1. Where root cannot make namespaces the fixture skips with the reason, and the
loopback hosts (test_multihost_jobs.py) still run.

The spec reaches the hosts as a user's would: `launch.hosts`, the sshd's port and key in
`launch.ssh`, `launch.interface: tknet` (every host's own link, and the launching machine's
bridge, share the name as a cluster's nodes share eth0); the job starts from the project
directory with a relative script path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.netns import NamespaceCluster
from tests.realrun import BIN, ROOT, SPECS, json_objects, rank_env, run
from tests.resuming import weights
from tests.supervised import CONTRACT_SECONDS, ended, start_training_job, wait_for_ranks
from toolkit.parity.cases import TOLERANCE, all_cases, merge
from toolkit.parity.harness import Harness, weight_deviation
from toolkit.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.multiproc]

STALL_SECONDS = 8.0
UP_SECONDS = 240.0


def hosts_launch(cluster: NamespaceCluster, count: int, launcher: str) -> dict[str, Any]:
    hosts = [f"{address}:1" for address in cluster.ssh.hosts[:count]]
    return {**cluster.launch_section(), "hosts": hosts, "launcher": launcher}


@pytest.fixture
def nothing_left(namespace_cluster: NamespaceCluster) -> Iterator[None]:
    """Every link up again after the test, and nothing it started still running anywhere."""
    yield
    for address in namespace_cluster.ssh.hosts:
        namespace_cluster.network.mend(address)
    deadline = time.monotonic() + 15
    while namespace_cluster.ssh.processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = namespace_cluster.ssh.processes()
    if left:
        listing = [p.cmdline() for p in left]
        for process in left:
            with contextlib.suppress(Exception):
                process.kill()
        pytest.fail(f"test left processes running on the namespace hosts (now killed): {listing}")


@pytest.mark.usefixtures("nothing_left")
def test_two_namespace_hosts_train_to_the_reference_weights(
    namespace_cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """DDP under torchrun, one rank per host, Gloo across the links: the weights of the
    single-process reference (toolkit.parity), as on the loopback hosts."""
    (case,) = [case for case in all_cases() if case.name == "ddp/torchrun:mlp:adamw"]
    launch = hosts_launch(namespace_cluster, 2, "torchrun")
    case = dataclasses.replace(case, spec=merge(case.spec, {"launch": launch}))
    outcome = Harness(tmp_path).run_case(case)
    assert outcome.status == "pass", outcome


@pytest.mark.usefixtures("nothing_left")
def test_a_relative_script_path_runs_on_namespace_hosts(
    namespace_cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """The README's start, from the project directory, on hosts whose ranks share nothing but
    the files: the digits example trains on two hosts under torchrun."""
    spec: dict[str, Any] = yaml.safe_load((SPECS / "ddp.yaml").read_text())
    spec["launch"] = {**hosts_launch(namespace_cluster, 2, "torchrun"), "master_port": free_port()}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    script = ["hvd_examples/torch_digits.py", "--epochs", "1", "--min-accuracy", "0"]
    result = run([str(BIN / "toolkit"), "launch", "--spec", str(path), "--", *script], cwd=ROOT)
    assert result.returncode == 0, result.explain()


@pytest.mark.usefixtures("nothing_left")
def test_a_partitioned_host_ends_the_job_naming_it(
    namespace_cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """The link of 10.77.0.12 is cut while the job trains: a real partition, packets dropped
    both ways, nothing closed. Its peer waits in the next all-reduce, its heartbeats stop
    arriving, and the job ends within the stall timeout, naming the host; the host still
    connected keeps nothing running. (The cut host's processes cannot be reached while cut;
    the fixture mends the link and they end with their ssh sessions.)"""
    spec: dict[str, Any] = yaml.safe_load((SPECS / "ddp.yaml").read_text())
    spec["launch"] = {**hosts_launch(namespace_cluster, 2, "torchrun"), "master_port": free_port()}
    spec["timeouts"] = {"stall_s": STALL_SECONDS, "collective_s": 600}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    kept, cut = namespace_cluster.ssh.hosts[:2]
    job, piddir, log = start_training_job(path, tmp_path, rank_env())
    try:
        wait_for_ranks(piddir, bound=UP_SECONDS, job=job, log=log)
        namespace_cluster.network.cut(cut)
        status, seconds = ended(job, STALL_SECONDS + CONTRACT_SECONDS)
        still_there = [p.cmdline() for p in namespace_cluster.ssh.processes(kept)]
    finally:
        job.kill()
    output = log.read_text()
    print(f"ended {seconds:.1f} s after the cut; status {status}")
    assert status == 124, output[-3000:]
    assert re.search(rf"rank \d on host {re.escape(cut)} stalled \(no heartbeat for ", output), (
        output[-3000:]
    )
    assert still_there == []


def wait_for_a_checkpoint(checkpoints: Path, job: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + UP_SECONDS
    while not (checkpoints / "latest").exists():
        if job.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint was saved:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


@pytest.mark.usefixtures("nothing_left")
def test_a_job_that_loses_a_host_for_good_finishes_on_the_hosts_left(
    namespace_cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """Three hosts, one rank each, `max_restarts: 1` and `min_np: 2`: once a checkpoint is
    saved, the link of 10.77.0.13 is cut and stays cut. The job ends on the stall, restarts,
    finds that host not answering, and finishes on the other two from its newest checkpoint,
    the global batch held (accumulation 2 -> 3): the weights of an uninterrupted run within
    the parity tolerance (another world size, so not bitwise)."""
    checkpoints = tmp_path / "checkpoints"
    launch = {
        **hosts_launch(namespace_cluster, 3, "torchrun"),
        "master_port": free_port(),
        "max_restarts": 1,
        "min_np": 2,
    }
    spec = {
        "backend": "ddp",
        "seed": 3,
        "batch": {"global": 48, "micro": 8},
        "optimizer": {"name": "adam", "lr": 0.01},
        "checkpoint": {"dir": str(checkpoints), "every_steps": 2, "keep": 2},
        "timeouts": {"stall_s": STALL_SECONDS, "collective_s": 600},
        "launch": launch,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    script = ["tests/scripts/resume_torch.py", "--spec", str(path), "--steps", "16"]
    out, log = tmp_path / "weights.npz", tmp_path / "job.log"
    argv = [str(BIN / "toolkit"), "launch", "--spec", str(path), "--", *script]
    argv += ["--out", str(out), "--step-seconds", "0.5"]
    with log.open("wb") as sink:
        job = subprocess.Popen(argv, cwd=ROOT, env=rank_env(), stdout=sink, stderr=sink)
    try:
        wait_for_a_checkpoint(checkpoints, job, log)
        namespace_cluster.network.cut(namespace_cluster.ssh.hosts[2])
        status, seconds = ended(job, UP_SECONDS)
    finally:
        job.kill()
    output = log.read_text()
    print(f"finished {seconds:.1f} s after the cut; status {status}")
    assert status == 0, output[-4000:]
    assert re.search(r"rank 2 on host 10\.77\.0\.13 stalled", output), output[-4000:]
    assert "toolkit launch: restart 1 of 1 after" in output, output[-4000:]
    shrunk = r"not answering: 10\.77\.0\.13 \(ssh .*\); continuing on 2 of 3 hosts with 2 rank"
    assert re.search(shrunk, output), output[-4000:]
    resumed = {r["rank"]: r["resumed_from"] for r in json_objects(output) if "resumed_from" in r}
    assert set(resumed) == {0, 1} and resumed[0] == resumed[1] > 0, output[-4000:]
    assert weight_deviation(weights(out), reference(tmp_path, spec, script)) <= TOLERANCE["fp32"]


def reference(where: Path, spec: dict[str, Any], script: list[str]) -> dict[str, Any]:
    """The same 16 steps on one rank here, nothing interrupted."""
    alone = {**spec, "launch": {"np": 1}, "checkpoint": {}}
    path = where / "reference.yaml"
    path.write_text(yaml.safe_dump(alone))
    out = where / "reference.npz"
    argv = [str(BIN / "toolkit"), "launch", "--spec", str(path), "--", script[0]]
    result = run([*argv, "--spec", str(path), "--steps", "16", "--out", str(out)], cwd=ROOT)
    assert result.returncode == 0, result.explain()
    return weights(out)
