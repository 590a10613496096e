"""Daemons the cluster fixtures start and stop, and finding what they left behind.

Daemons run in the foreground (`sshd -D`, `slurmd -D`, `munged -F`) as children of the test
process, so that the test owns them: it reaps them (this machine's PID 1 reaps nothing), reads
their output from a log file, and stops them. Processes started through a daemon (an ssh
session, a Slurm job step) are found afterwards by a marker variable in their environment,
which also finds them once they are reparented away from the daemon.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

SYSTEM_BIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/bin", "/bin")
STOP_GRACE_S = 5.0


class ClusterUnavailable(Exception):
    """A test cluster cannot run here (a program is not installed); the message is one line."""


def program(name: str, package: str) -> str:
    """Absolute path of `name` (also searched in the sbin directories a user's PATH may lack:
    sshd must be started by absolute path)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_BIN_DIRS])
    found = shutil.which(name, path=search)
    if found is None:
        raise ClusterUnavailable(f"{name} not found: install Debian's {package} (scripts/setup.sh)")
    return os.path.abspath(found)


def free_port(addresses: Sequence[str]) -> int:
    """A TCP port free on every address a moment ago (the OS picks it on the first)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind((addresses[0], 0))
            port: int = first.getsockname()[1]
            if all(_bindable(address, port) for address in addresses[1:]):
                return port
    raise RuntimeError(f"no TCP port free on all of {', '.join(addresses)}")


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
        return True


def clean_env(base: Mapping[str, str], drop_prefixes: Sequence[str] = ()) -> dict[str, str]:
    """A copy of `base` without the test harness's process marker and the given prefixes."""
    return {
        key: value
        for key, value in base.items()
        if key != "TOOLKIT_TEST_PROCESS_MARK" and not key.startswith(tuple(drop_prefixes))
    }


class Daemon:
    """One foreground daemon, its output in `log`; `stop()` ends it and its process tree."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str]):
        self.name = name
        self.argv = list(argv)
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def describe(self) -> str:
        """Its command, whether it still runs, and the end of its log: for failure messages."""
        state = "running" if self.alive() else f"exited with {self.popen.returncode}"
        lines = self.log.read_text(errors="replace").splitlines()[-20:] if self.log.exists() else []
        return f"{self.name} ({state}): {' '.join(self.argv)}\n" + "\n".join(
            f"  | {line}" for line in lines
        )

    def stop(self) -> None:
        try:
            main = psutil.Process(self.popen.pid)
            tree = [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        terminate(tree)
        self.popen.wait(timeout=STOP_GRACE_S)


def terminate(processes: Sequence[psutil.Process]) -> None:
    """SIGTERM, then SIGKILL whatever is still there after a grace period."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=STOP_GRACE_S)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=STOP_GRACE_S)


def marked_processes(name: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment has name=value, with everything they started."""
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter():
        try:
            if process.environ().get(name) != value or process.pid == os.getpid():
                continue
            for member in (process, *process.children(recursive=True)):
                if member.status() != psutil.STATUS_ZOMBIE:
                    found[member.pid] = member
        except psutil.Error:
            continue
    return list(found.values())


def describe_processes(processes: Sequence[psutil.Process]) -> str:
    lines = []
    for process in processes:
        try:
            lines.append(f"{process.pid} {' '.join(process.cmdline())[:160]}")
        except psutil.Error:
            continue
    return "\n".join(lines)


def wait_until(
    ready: Callable[[], bool], what: str, *, bound_s: float, daemons: Sequence[Daemon] = ()
) -> None:
    """Poll `ready` until it holds; fail naming `what` with the daemons' logs when a daemon
    exits or `bound_s` (a generous contract bound, not a timing expectation) passes."""
    deadline = time.monotonic() + bound_s
    delay = 0.02
    while not ready():
        dead = [daemon for daemon in daemons if not daemon.alive()]
        if dead or time.monotonic() > deadline:
            reason = "a daemon exited" if dead else f"not within {bound_s:.0f} s"
            logs = "\n".join(daemon.describe() for daemon in daemons)
            raise RuntimeError(f"{what}: {reason}\n{logs}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def accepts_connections(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1.0):
            return True
    except OSError:
        return False
