"""Several ssh "hosts" on one machine: one private sshd per loopback address.

Every address of 127.0.0.0/8 is up on Linux's loopback interface, and 127.0.0.2 and 127.0.0.3
are not this machine's interface addresses, so launchers that decide "local or remote" by
comparing with the interface addresses (Open MPI, horovodrun) reach them through ssh. One sshd
per address (all on one free port, with a generated host key, a generated client key and their
own config) means that a single "host" can later be taken away by stopping its sshd.

Nothing outside the temporary directory changes, except /run/sshd, the privilege separation
directory Debian's sshd refuses to start without (its service creates it the same way).

The sshds behave like a stock Debian one: they accept LANG and LC_* from the client and nothing
else, so a remote process sees the login environment, not the caller's (PATH is the default
one; use absolute paths for the venv's programs). Launchers carry their own variables: mpirun
with `-x`, horovodrun and the deepspeed launcher by writing them into the remote command line.
Each sshd sets TOOLKIT_TEST_SSH_HOST (the address the session came in on) and
TOOLKIT_TEST_SSH_CLUSTER (this cluster's marker) in every session: a process knows which
"host" it runs on (`hostname` is the same everywhere), and the tests find what a job left
running on each host.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psutil

from tests.cluster.processes import (
    ClusterUnavailable,
    Daemon,
    accepts_connections,
    clean_env,
    free_port,
    marked_processes,
    program,
    terminate,
    wait_until,
)

REMOTE_HOSTS = ("127.0.0.2", "127.0.0.3")
ADDRESSES = ("127.0.0.1", *REMOTE_HOSTS)
HOST_VAR = "TOOLKIT_TEST_SSH_HOST"
CLUSTER_VAR = "TOOLKIT_TEST_SSH_CLUSTER"
PRIVSEP_DIR = Path("/run/sshd")
START_BOUND_S = 30.0

SSHD_CONFIG = """\
Port {port}
ListenAddress {address}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
X11Forwarding no
AcceptEnv LANG LC_*
SetEnv {host_var}={address} {cluster_var}={marker}
# Launchers open many connections at once (horovodrun checks every host in parallel).
MaxStartups 100:30:200
MaxSessions 100
"""

CLIENT_CONFIG = """\
Host *
  Port {port}
  IdentityFile {identity}
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  GlobalKnownHostsFile /dev/null
  BatchMode yes
  LogLevel ERROR
  ConnectTimeout 10
  SendEnv LANG LC_*
"""

HOST_KEYS_CONFIG = """\
Host *
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  GlobalKnownHostsFile /dev/null
  LogLevel ERROR
"""
"""What a spec's launch.ssh.config_file holds in the tests: only host-key settings (the keys
are generated per session), so port and identity must come from launch.ssh itself."""


@dataclass(frozen=True)
class SshCluster:
    """Hosts reachable by ssh on a private port. How each launcher is pointed at them (each
    seen placing one rank on 127.0.0.2 and one on 127.0.0.3 with Open MPI 4.1.4, Horovod
    0.28.1, DeepSpeed 0.19.8 and pdsh 2.34; mpirun and pdsh in test_ssh_cluster.py):

    - plain ssh: `ssh -F config_file HOST CMD` (`ssh_argv`), or `-p port -i identity_file`
      with `-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes`.
    - any launcher at once: `env()` puts `bin_dir` first on PATH; its `ssh` is
      `ssh -F config_file "$@"`, and every launcher here runs `ssh` from PATH. Options a
      launcher passes itself (horovodrun's `-p`/`-i`) still win over the config file.
    - mpirun (Open MPI 4.1): `--mca plm_rsh_args "-F config_file"` (`mpirun_mca()`), or the
      environment `OMPI_MCA_plm_rsh_args` / `OMPI_MCA_plm_rsh_agent="ssh -F config_file"`. It
      treats 127.0.0.2 and 127.0.0.3 as remote (they are not interface addresses) with no
      further setting. Its TCP traffic between ranks uses interface addresses (eth0, or lo's
      127.0.0.1 with `--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo`), never
      127.0.0.2/3 themselves.
    - horovodrun: `-p PORT -i IDENTITY` (`--ssh-port`, `--ssh-identity-file`); it adds
      `-o StrictHostKeyChecking=no` but no UserKnownHostsFile, so without the PATH wrapper it
      records the generated host keys in ~/.ssh/known_hosts. With `--mpi` it hands the same
      two options to mpirun as `-mca plm_rsh_args`. With `--gloo` it picks eth0 for Gloo and
      the rendezvous (192.0.2.x here) unless given `--network-interfaces lo` (then 127.0.0.1).
    - pdsh: `PDSH_RCMD_TYPE=ssh` and `PDSH_SSH_ARGS_APPEND="-F config_file"` (`pdsh_env()`).
    - deepspeed launcher: `--ssh_port PORT` (used for its own ssh check and appended to
      PDSH_SSH_ARGS_APPEND); it has no identity option and its check (`ssh -o
      PasswordAuthentication=no -p PORT HOST hostname`) sees only ~/.ssh: use the PATH
      wrapper, or `--no_ssh_check` with `pdsh_env()` in its environment (it keeps an existing
      PDSH_SSH_ARGS_APPEND). Give `--master_addr`, or it asks the first host `hostname -I`
      (the eth0 address). `--launcher openmpi` takes `--launcher_args` for mpirun (add
      `--mca btl_tcp_if_include lo`: it otherwise forces eth0).
    - torchrun: no ssh of its own; run it on every host through `ssh_argv`.
    """

    hosts: tuple[str, ...]
    """The hosts launchers see as remote: 127.0.0.2 and 127.0.0.3 (or the namespace hosts)."""
    addresses: tuple[str, ...]
    """Every address an sshd serves: 127.0.0.1 and the hosts (or the hosts alone)."""
    port: int
    identity_file: Path
    config_file: Path
    """ssh client configuration: Port, IdentityFile, no host key checks, BatchMode."""
    host_keys_file: Path
    """ssh client configuration with the host-key settings alone (HOST_KEYS_CONFIG)."""
    bin_dir: Path
    """Holds an `ssh` that always reads config_file."""
    marker: str
    """Value of TOOLKIT_TEST_SSH_CLUSTER in every session of this cluster."""
    daemons: Mapping[str, Daemon]
    """The sshd serving each address."""

    def ssh_argv(self, host: str, command: Sequence[str]) -> list[str]:
        """ssh runs its command through the remote shell: quoting it keeps it an argv."""
        return ["ssh", "-F", str(self.config_file), host, shlex.join(command)]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default os.environ) with the ssh wrapper first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH", "")])
        return env

    def launch_section(self) -> dict[str, object]:
        """A spec's `launch` settings that reach these hosts the way a user's spec would:
        the port and the key in launch.ssh, host keys in a config file, traffic on lo."""
        return {
            "ssh": {
                "port": self.port,
                "identity_file": str(self.identity_file),
                "config_file": str(self.host_keys_file),
            },
            "interface": "lo",
        }

    def mpirun_mca(self) -> list[str]:
        return ["--mca", "plm_rsh_args", f"-F {self.config_file}"]

    def pdsh_env(self) -> dict[str, str]:
        return {"PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND": f"-F {self.config_file}"}

    def processes(self, host: str | None = None) -> list[psutil.Process]:
        """What runs through this cluster's sessions (on one host, or on any)."""
        found = marked_processes(CLUSTER_VAR, self.marker)
        if host is None:
            return found
        return [p for p in found if _environ(p).get(HOST_VAR) == host]


def _environ(process: psutil.Process) -> dict[str, str]:
    try:
        return process.environ()
    except psutil.Error:
        return {}


def _keygen(path: Path) -> None:
    subprocess.run(
        [program("ssh-keygen", "openssh-client"), "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )


@contextmanager
def start_ssh_cluster(
    root: Path,
    hosts: Sequence[str] = REMOTE_HOSTS,
    addresses: Sequence[str] = ADDRESSES,
    run_at: Callable[[str, list[str]], list[str]] = lambda _address, argv: argv,
    port: int | None = None,
) -> Iterator[SshCluster]:
    """Start one sshd per address under `root`; stop them and their sessions on exit.
    By default the loopback hosts; `run_at(address, argv)` says how to start a program where
    that address lives (tests/cluster/netns.py: inside its namespace). Raises
    ClusterUnavailable (one line) when openssh-server or openssh-client is missing."""
    sshd = program("sshd", "openssh-server")
    ssh = program("ssh", "openssh-client")
    root.mkdir(parents=True, exist_ok=True)
    host_key, identity = root / "host_key", root / "id_ed25519"
    _keygen(host_key)
    _keygen(identity)
    authorized_keys = root / "authorized_keys"
    authorized_keys.write_text(identity.with_suffix(".pub").read_text())
    try:
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    except PermissionError:
        raise ClusterUnavailable(f"sshd needs {PRIVSEP_DIR}: create it as root") from None
    port = free_port(addresses) if port is None else port
    marker = uuid.uuid4().hex
    config_file = root / "ssh_config"
    config_file.write_text(CLIENT_CONFIG.format(port=port, identity=identity))
    host_keys_file = root / "ssh_host_keys_config"
    host_keys_file.write_text(HOST_KEYS_CONFIG)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(
        f'#!/bin/sh\nexec {shlex.quote(ssh)} -F {shlex.quote(str(config_file))} "$@"\n'
    )
    wrapper.chmod(0o755)

    daemons: dict[str, Daemon] = {}
    try:
        for address in addresses:
            config = root / f"sshd_config.{address}"
            config.write_text(
                SSHD_CONFIG.format(
                    port=port,
                    address=address,
                    host_key=host_key,
                    pid_file=root / f"sshd.{address}.pid",
                    authorized_keys=authorized_keys,
                    host_var=HOST_VAR,
                    cluster_var=CLUSTER_VAR,
                    marker=marker,
                )
            )
            argv = run_at(address, [sshd, "-D", "-e", "-f", str(config)])
            daemons[address] = Daemon(
                f"sshd {address}", argv, root / f"sshd.{address}.log", clean_env(os.environ)
            )
        for address, daemon in daemons.items():
            wait_until(
                partial(accepts_connections, address, port),
                f"sshd on {address}:{port}",
                bound_s=START_BOUND_S,
                daemons=[daemon],
            )
        cluster = SshCluster(
            hosts=tuple(hosts),
            addresses=tuple(addresses),
            port=port,
            identity_file=identity,
            config_file=config_file,
            host_keys_file=host_keys_file,
            bin_dir=bin_dir,
            marker=marker,
            daemons=daemons,
        )
        yield cluster
    finally:
        for daemon in daemons.values():
            daemon.stop()
        terminate(marked_processes(CLUSTER_VAR, marker))
