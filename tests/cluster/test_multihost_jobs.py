"""Jobs on two hosts through `toolkit launch` and the real launchers, and faults between hosts.

The hosts are 127.0.0.2 and 127.0.0.3 behind the private sshds (tests/cluster/sshd.py), one
rank each. The spec reaches them as a user's would: `launch.hosts`, the sshd's port and key in
`launch.ssh`, host keys in `launch.ssh.config_file`, traffic on `launch.interface: lo`.

Parity: each engine trains the parity model on both hosts and must end with the weights of the
single-process reference, like the one-host parity cases (toolkit.parity). By default a
representative subset runs (with the fault tests, every way of reaching a host but
horovodrun's); `TOOLKIT_CLUSTER=full` runs every engine × launcher pair listed in FULL.

TF MultiWorkerMirrored runs here because worker ports are unique across the job
(toolkit.render.tf): with ports counted per host, the two loopback "hosts" collided in
TensorFlow's gRPC server, which binds 0.0.0.0:port.

Jobs start as the README shows them, too: from the project directory with a relative script
path, which the remote ranks resolve in the same directory.

Not run here: a network partition. The ranks talk over 127.0.0.1 (lo's address), not the host
addresses, so dropping a host address's traffic would cut ssh but not the ranks; the namespace
hosts of test_namespace_hosts.py cut a real link. A lost host (below) is the loopback hosts'
nearest: its processes freeze, so its peers wait instead of failing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.cluster.sshd import SshCluster, start_ssh_cluster
from tests.options import FULL_CLUSTER
from tests.realrun import BIN, ROOT, SPECS, rank_env, run
from tests.supervised import CONTRACT_SECONDS, ended, start_training_job, wait_for_ranks
from toolkit.parity.cases import all_cases, merge
from toolkit.parity.harness import Harness
from toolkit.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.multiproc]

HOSTS = ["127.0.0.2:1", "127.0.0.3:1"]
SUBSET = [
    ("zero2/deepspeed:mlp:adamw", None),
    ("tf-multiworker/local:mlp:adamw", None),
]
"""With the fault tests below (mpirun, torchrun), every ssh path runs by default."""
FULL = [
    *SUBSET,
    ("horovod/horovodrun-gloo:mlp:adamw", None),
    ("ddp/torchrun:mlp:adamw", None),
    ("ddp/torchrun:mlp:adamw", "local"),
    ("ddp/torchrun:mlp:adamw", "mpirun"),
    ("horovod/mpirun:mlp:adamw", None),
    # horovodrun's MPI mode across hosts: what a spec without a controller runs where Horovod
    # has MPI (toolkit/launch/machine_settings.py).
    ("horovod/mpirun:mlp:adamw", "horovodrun"),
    ("zero3/deepspeed:mlp:adamw", None),
    ("pipeline2/deepspeed:mlp:adamw", None),
    ("horovod-tf/horovodrun-gloo:mlp:adamw", None),
]
CASES = FULL if FULL_CLUSTER else SUBSET
STALL_SECONDS = 8.0
UP_SECONDS = 240.0


def two_host_launch(cluster: SshCluster, launcher: str | None) -> dict[str, Any]:
    launch: dict[str, Any] = {**cluster.launch_section(), "hosts": HOSTS}
    if launcher is not None:
        launch["launcher"] = launcher
    return launch


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """One harness for the module: the single-process reference runs once."""
    return Harness(tmp_path_factory.mktemp("multihost-parity"))


@pytest.mark.usefixtures("no_ssh_leftovers")
@pytest.mark.parametrize(
    ("name", "launcher"), CASES, ids=[f"{name}@{launcher or 'own'}" for name, launcher in CASES]
)
def test_two_hosts_train_to_the_reference_weights(
    ssh_cluster: SshCluster,
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    launcher: str | None,
) -> None:
    (case,) = [case for case in all_cases() if case.name == name]
    launch = two_host_launch(ssh_cluster, launcher)
    if (launcher or case.launcher) == "horovodrun":
        # horovodrun has no option for an ssh config file: the host-key settings come from
        # the ssh on PATH, as from ~/.ssh/config on a real cluster.
        del launch["ssh"]["config_file"]
        monkeypatch.setenv("PATH", ssh_cluster.env()["PATH"])
    case = dataclasses.replace(case, spec=merge(case.spec, {"launch": launch}))
    outcome = harness.run_case(case)
    assert outcome.status == "pass", outcome


@pytest.mark.usefixtures("no_ssh_leftovers")
@pytest.mark.parametrize("launcher", ["torchrun", "local"])
def test_a_relative_script_path_runs_on_both_hosts_as_the_readme_starts_it(
    ssh_cluster: SshCluster, tmp_path: Path, launcher: str
) -> None:
    """From the project directory, a script named relative to it: the remote ranks start in
    the same directory (a remote shell starts in the home directory, where the path means
    nothing). torchrun runs once per host and the local launcher starts each rank there."""
    spec: dict[str, Any] = yaml.safe_load((SPECS / "ddp.yaml").read_text())
    spec["launch"] = {**two_host_launch(ssh_cluster, launcher), "master_port": free_port()}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    script = ["hvd_examples/torch_digits.py", "--epochs", "1", "--min-accuracy", "0"]
    result = run([str(BIN / "toolkit"), "launch", "--spec", str(path), "--", *script], cwd=ROOT)
    assert result.returncode == 0, result.explain()


def stall_spec(cluster: SshCluster, launcher: str, directory: Path) -> Path:
    spec: dict[str, Any] = yaml.safe_load((SPECS / "ddp.yaml").read_text())
    spec["launch"] = {**two_host_launch(cluster, launcher), "master_port": free_port()}
    spec["timeouts"] = {"stall_s": STALL_SECONDS, "collective_s": 600}
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def assert_nothing_left(cluster: SshCluster) -> None:
    deadline = time.monotonic() + 15
    while cluster.processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = cluster.processes()
    assert not left, [p.cmdline() for p in left]


@pytest.mark.usefixtures("no_ssh_leftovers", "no_orphans")
def test_a_rank_stopped_on_a_remote_host_ends_the_job(
    ssh_cluster: SshCluster, tmp_path: Path
) -> None:
    """SIGSTOP on the rank of 127.0.0.3 (mpirun placed it there): the stall timeout ends the
    job naming that rank and host, and the sweep kills the stopped rank there (mpirun's own
    teardown cannot: a stopped process does not act on SIGTERM)."""
    job, piddir, log = start_training_job(
        stall_spec(ssh_cluster, "mpirun", tmp_path), tmp_path, rank_env()
    )
    try:
        ranks = wait_for_ranks(piddir, bound=UP_SECONDS, job=job, log=log)
        os.kill(ranks[1], signal.SIGSTOP)
    except BaseException:
        job.kill()
        raise
    status, seconds = ended(job, STALL_SECONDS + CONTRACT_SECONDS)
    output = log.read_text()
    print(f"ended {seconds:.1f} s after SIGSTOP")
    assert status == 124, output[-3000:]
    assert "rank 1 on host 127.0.0.3 stalled (no heartbeat for " in output, output[-3000:]
    assert_nothing_left(ssh_cluster)


@pytest.mark.usefixtures("no_orphans")
def test_a_lost_host_ends_the_job(tmp_path: Path) -> None:
    """Host 127.0.0.3 is lost mid-run: its sshd stops and every process on it freezes
    (SIGSTOP: like a host that lost power or its network, it sends nothing and closes nothing,
    so its peers wait instead of failing). The job ends by itself within the stall timeout,
    names the lost rank and host, and leaves nothing on the host that is still there; what is
    on the lost host is beyond reach (the test kills it afterwards). A cluster of its own:
    this test takes a host away."""
    with start_ssh_cluster(tmp_path / "ssh") as cluster:
        job, piddir, log = start_training_job(
            stall_spec(cluster, "torchrun", tmp_path), tmp_path, rank_env()
        )
        lost: list[psutil.Process] = []
        try:
            wait_for_ranks(piddir, bound=UP_SECONDS, job=job, log=log)
            listener = psutil.Process(cluster.daemons["127.0.0.3"].popen.pid)
            lost = listener.children(recursive=True)  # its ssh sessions and what they run
            for process in lost:
                process.suspend()
            listener.kill()
            status, seconds = ended(job, STALL_SECONDS + CONTRACT_SECONDS)
            still_there = [p.cmdline() for p in cluster.processes("127.0.0.2")]
        finally:
            job.kill()
            for process in lost:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        output = log.read_text()
        print(f"ended {seconds:.1f} s after the host was lost; status {status}")
        assert lost, "nothing ran on 127.0.0.3"
        assert status == 124, output[-3000:]
        # torchrun's rendezvous decides which host gets rank 0
        assert re.search(r"rank \d on host 127\.0\.0\.3 stalled \(no heartbeat for ", output), (
            output[-3000:]
        )
        assert still_there == []
