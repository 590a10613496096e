"""Other hosts, reached by ssh: the command that runs something there, a check that every host
answers before a job starts, and the sweep that stops what a job left there.

ssh hands its command to the remote user's shell as one string, so an argv is quoted with
`shlex.join` and stays an argv there; variables travel in the command (`env NAME=VALUE ...`),
because a stock sshd accepts only LANG and LC_* from the client. The remote side sees its
login PATH, so programs are named by absolute path: the toolkit, its interpreter, the
launchers and the working directory are expected at the same paths on every host, as
horovodrun, mpirun and the deepspeed launcher expect too. Only the job's own variables travel
(the plan's, which include `launch.env`, and the supervisor's): a variable a remote rank needs
goes in `launch.env`.

A remote command outlives its ssh client when the client is killed (no terminal, no SIGHUP),
and launchers differ in what they leave on other hosts when a job fails. Every process of a
supervised job carries TOOLKIT_JOB_ID, so at the end of a job the supervisor runs
`toolkit.launch.reap` on each remote host, which stops every process carrying that job's id and
removes the files the job's engines left in that host's /dev/shm.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.rank_variables import TOOLKIT_HOST
from toolkit.spec.hosts import LOCAL_NAMES
from toolkit.spec.sections import SshSpec

CHECK_TIMEOUT_S = 20.0
"""Bound on one host's ssh check (connection and a trivial command)."""
REAP_TIMEOUT_S = 20.0
"""Bound on one host's sweep at the end of a job; a host that cannot be reached is skipped."""
_SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
"""Never prompt (a prompt would hang a job), and give up on a host that does not answer."""


def ssh_argv(
    ssh: SshSpec,
    host: str,
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> list[str]:
    """`ssh [spec options] HOST '[cd CWD &&] exec env NAME=VALUE ... command'`, every element
    quoted."""
    remote = shlex.join(
        ["env", *(f"{name}={value}" for name, value in (env or {}).items()), *command]
    )
    if cwd is not None:
        remote = f"cd {shlex.quote(str(cwd))} && exec {remote}"
    return ["ssh", *ssh.options(), *_SSH_OPTIONS, host, remote]


def check_hosts(ssh: SshSpec, hosts: Sequence[str], python: str) -> None:
    """Every host answers ssh without a prompt and runs this interpreter with the toolkit; the
    first one that does not is a one-line error naming the host, what failed and the fix."""
    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        problems = list(pool.map(lambda host: host_problem(ssh, host, python), hosts))
    for host, problem in zip(hosts, problems, strict=True):
        if problem is not None:
            raise ToolkitError(
                f"host {host} is not usable: {problem}",
                "check launch.hosts and launch.ssh (port, identity_file, config_file), "
                "or run `toolkit doctor --hosts` for every check",
            )


def host_problem(ssh: SshSpec, host: str, python: str) -> str | None:
    """Why `host` cannot run a rank now (ssh fails, or `python` there lacks the toolkit), or
    None when it can."""
    probe = [python, "-c", "import toolkit"]
    try:
        done = subprocess.run(
            ssh_argv(ssh, host, probe),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"ssh did not finish within {CHECK_TIMEOUT_S:g} s"
    except OSError as error:
        return f"ssh could not run ({error.strerror})"
    if done.returncode == 255:
        return "ssh failed: " + _last_line(done.stderr)
    if done.returncode != 0:
        return f"{probe[0]} cannot import toolkit there: " + _last_line(done.stderr)
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def reap_hosts(
    ssh: SshSpec, hosts: Sequence[str], python: str, job_id: str, started_at: float
) -> None:
    """Stop, on each host, every process of job `job_id` and remove its /dev/shm leftovers
    (bounded; unreachable hosts skipped: a host that is gone has nothing left that ssh could
    reach)."""
    command = reap_command(python, job_id, started_at)

    def sweep(host: str) -> None:
        try:
            subprocess.run(
                ssh_argv(ssh, host, command),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=REAP_TIMEOUT_S,
                check=False,
            )
        except (subprocess.TimeoutExpired, OSError):
            return

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        list(pool.map(sweep, hosts))


def reap_command(python: str, job_id: str, started_at: float) -> list[str]:
    return [python, "-m", "toolkit.launch.reap", job_id, repr(started_at)]


@dataclass(frozen=True)
class RemoteHosts:
    """A job on several hosts, as the supervisor needs it: how to reach the hosts, where each
    rank runs, and what runs once per host."""

    ssh: SshSpec
    python: str
    """The interpreter, at the same path on every host (runs the sweep)."""
    hosts: tuple[str, ...]
    """The hosts other than this machine."""
    heartbeat_host: str
    """This machine's address as the other hosts reach it."""
    placement: Mapping[int, str] = field(default_factory=dict)
    """Rank -> host, where the plan decides it."""
    run_on: tuple[str, ...] = ()
    """Hosts on which the launcher itself runs once each (torchrun); empty = once, here."""
    host_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Variables the launcher gets on one host of `run_on` only."""
    env_file: Path | None = None
    """File of NAME=VALUE lines the launcher exports to every host (see `env_variable`)."""
    env_variable: str = "DS_ENV_FILE"
    """The variable naming `env_file` to the launcher (the deepspeed launcher's; it joins it
    to its search paths, so it is written absolute)."""
    cwd: Path | None = None
    """Where the job was started: what runs on another host starts in the same directory, as
    mpirun's ranks and the deepspeed launcher's do, so that a relative script path (`toolkit
    launch -- hvd_examples/torch_digits.py`) means the same file there."""

    def is_remote(self, host: str) -> bool:
        return host not in LOCAL_NAMES

    def command(self, host: str, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        """argv to run on `host` with `env` (and TOOLKIT_HOST): over ssh, or as is here (this
        machine's processes already have the environment)."""
        if not self.is_remote(host):
            return list(argv)
        return ssh_argv(self.ssh, host, argv, {**env, TOOLKIT_HOST: host}, self.cwd)

    def write_env_file(self, env: Mapping[str, str]) -> Path:
        """Write `env` to `env_file` (absolute path returned)."""
        if self.env_file is None:
            raise ValueError("this job has no env_file")
        path = self.env_file.resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{name}={value}\n" for name, value in env.items()))
        return path

    def reap(self, job_id: str, started_at: float) -> None:
        reap_hosts(self.ssh, self.hosts, self.python, job_id, started_at)
