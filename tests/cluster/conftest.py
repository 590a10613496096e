"""Test clusters the tests start and stop themselves: ssh "hosts" on loopback addresses behind
private sshds (tests/cluster/sshd.py), hosts in network namespaces with a link of their own
(tests/cluster/netns.py, where root can make them) and a single-machine Slurm
(tests/cluster/slurm.py).

Both are session-scoped, live under pytest's temporary directory, change no system file, come
up in about a second, and skip with one line when Debian's packages are missing
(scripts/setup.sh installs them). Tests that run jobs through the ssh hosts also use
`no_ssh_leftovers`, which fails a test that leaves a process running on any host.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.netns import NamespaceCluster, start_namespace_cluster
from tests.cluster.processes import ClusterUnavailable, describe_processes, terminate, wait_until
from tests.cluster.slurm import SlurmCluster, start_slurm_cluster
from tests.cluster.sshd import SshCluster, start_ssh_cluster

# An ssh session ends a moment after its client: a generous bound, not a timing claim.
SESSION_END_BOUND_S = 15.0


@pytest.fixture(scope="session")
def ssh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    """Hosts 127.0.0.2 and 127.0.0.3 (and 127.0.0.1) behind private sshds; see SshCluster for
    how ssh, mpirun, horovodrun, pdsh and the deepspeed launcher are pointed at them."""
    try:
        with start_ssh_cluster(tmp_path_factory.mktemp("ssh")) as cluster:
            yield cluster
    except ClusterUnavailable as missing:
        pytest.skip(f"ssh test cluster unavailable: {missing}")


@pytest.fixture(scope="session")
def namespace_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """Three hosts, 10.77.0.11-13, each a network namespace with its own sshd; a test that
    cuts a link mends it before it ends."""
    try:
        with start_namespace_cluster(tmp_path_factory.mktemp("netns"), 3) as cluster:
            yield cluster
    except ClusterUnavailable as missing:
        pytest.skip(f"namespace hosts unavailable: {missing}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A single-node Slurm, idle; run its commands with `slurm_cluster.env()`."""
    try:
        with start_slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
            yield cluster
    except ClusterUnavailable as missing:
        pytest.skip(f"Slurm test cluster unavailable: {missing}")


@pytest.fixture
def no_ssh_leftovers(ssh_cluster: SshCluster) -> Iterator[None]:
    """Fail the test if anything it started through the ssh hosts outlives it (and kill it)."""
    yield
    try:
        wait_until(
            lambda: not ssh_cluster.processes(),
            "processes left on the ssh hosts",
            bound_s=SESSION_END_BOUND_S,
        )
        return
    except RuntimeError:
        leftovers = ssh_cluster.processes()
    if leftovers:
        listing = describe_processes(leftovers)
        terminate(leftovers)
        pytest.fail(f"test left processes running on the ssh hosts (now killed):\n{listing}")
