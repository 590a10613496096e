"""One supervised job: the processes the supervisor started, their output, their heartbeats,
and the loop that decides when the job is over (see toolkit.launch.supervisor for the rules).
About 400 lines, kept together on purpose: the ending rules share one state (the
children, the heartbeat records, when each failure was first seen) and every part of a job is
needed to stop it, in order: its processes, its readers, its watchdog, its heartbeat socket.
The parts with a job of their own live beside it (output, tree, heartbeat, outcome, preemption).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import psutil

from toolkit.errors import ToolkitError
from toolkit.launch.heartbeat import INTERVAL, Heartbeats, RankRecord
from toolkit.launch.outcome import (
    INTERRUPTED,
    SIGNAL_BASE,
    TIMED_OUT,
    LaunchResult,
    describe_status,
    exit_code,
    signal_in,
)
from toolkit.launch.output import Console, LauncherTails, Lines, Prefixer, new_tail, pump
from toolkit.launch.parent_death import Watchdog, die_with_parent
from toolkit.launch.preemption import SIGNALS as PREEMPTING_SIGNALS
from toolkit.launch.preemption import PassOn
from toolkit.launch.shm_leftovers import remove_leftovers
from toolkit.launch.tree import ProcessTree, exit_status, pid_running
from toolkit.rank_variables import TOOLKIT_HEARTBEAT, TOOLKIT_JOB_ID

POLL_SECONDS = 0.2
END_REPORT_WAIT_SECONDS = 1.0
UNSEEN_END_GRACE_SECONDS = 20.0
"""How long a launcher may take to end the job after a rank ended with a status nobody saw
(the launcher reaped it at once). Such an end is often a clean one: under load the deepspeed
launcher took more than the 5 s grace to exit after both ranks exited 0, and the job was
stopped as failed. A known failed status keeps the short grace."""
LOOPBACK = "127.0.0.1"
SILENT_NOTE_SECONDS = 3 * INTERVAL
"""A rank silent this long when another rank fails is named in the report: a lost host kills
its ranks without a word, and its peers then fail first in the report's order."""


@dataclass
class _Child:
    """One process the supervisor started: a local rank, or the launcher (rank None)."""

    popen: subprocess.Popen[bytes]
    label: str
    rank: int | None
    tail: deque[str] = field(default_factory=new_tail)
    readers: list[threading.Thread] = field(default_factory=list)


@dataclass(frozen=True)
class _Ending:
    """What ended the supervision loop, before the tails are attached."""

    returncode: int
    reason: str
    rank: int | None = None
    host: str | None = None
    launcher_failed: int | None = None
    """The launcher's own status when it exited non-zero: the culprit is looked up later."""
    by_request: bool = False
    """Ctrl-C or --timeout ended it, not a fault."""


class Job:
    """Start with `start` (inside `starting()`), then `supervise` once."""

    def __init__(
        self,
        timeout: float | None,
        stall_timeout: float | None,
        grace: float,
        echo: bool,
        heartbeat_host: str,
        *,
        placement: Mapping[int, str] | None = None,
        on_teardown: Callable[[str, float], None] | None = None,
        preempt_s: float | None = None,
    ) -> None:
        """`placement`: the host of each rank where the plan decides it (several hosts), used
        to name a rank in reports. `on_teardown`: called with the job's id and its start (a
        time.time()) once every local process is stopped (the sweep of the job's remote
        hosts). `preempt_s`: a SIGTERM or SIGUSR1 asks the ranks to save and stop, and they
        have this long (None: a SIGTERM stops the job at once)."""
        self.timeout = timeout
        self.stall_timeout = stall_timeout
        self.grace = grace
        self.echo = echo
        self.children: list[_Child] = []
        self.tree = ProcessTree()
        self.console = Console()
        self.tails = LauncherTails()
        self.hostname = socket.gethostname()
        self.placement = dict(placement or {})
        self.on_teardown = on_teardown
        self.job_id = uuid.uuid4().hex
        bind = LOOPBACK if heartbeat_host == LOOPBACK else "0.0.0.0"
        self.heartbeats = Heartbeats(bind)
        self.heartbeat_address = f"{heartbeat_host}:{self.heartbeats.port}"
        self.started = time.monotonic()
        self.started_at = time.time()  # file times are wall-clock times
        self.watchdog = Watchdog(self.job_id, self.started_at)
        self._bad_end_seen: dict[int, float] = {}
        self._dead_since: dict[int, float] = {}
        self.preempt_s = preempt_s
        self._preemption: PassOn | None = None
        self.roles: dict[int, str] = {}
        """Local ranks' roles where they differ (a parameter-server job's), named in reports."""
        self.survivable: dict[int, str] = {}
        """Local ranks whose failure the job outlives, each with why (a parameter-server
        job's workers), as long as one of them is left."""
        self._lost: set[int] = set()

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Stop whatever started if starting the rest fails."""
        try:
            yield
        except BaseException:
            self._teardown()
            raise

    def supervisor_env(self) -> dict[str, str]:
        """What every process of the job gets from the supervisor (and remote ones must be
        given): where to send heartbeats, and the job's id."""
        return {TOOLKIT_HEARTBEAT: self.heartbeat_address, TOOLKIT_JOB_ID: self.job_id}

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        rank: int | None,
        label: str | None = None,
    ) -> None:
        """Start one process: a rank (`rank`), or a launcher (rank None), labelled in output
        and reports by `label` (default: the program's name, or "rank R")."""
        if isinstance(argv, str) or not argv:
            raise ValueError(f"argv must be a non-empty list of arguments, not {argv!r}")
        if label is None:
            label = os.path.basename(argv[0]) if rank is None else f"rank {rank}"
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            popen = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out_write,
                stderr=err_write,
                start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),
            )
        except FileNotFoundError:
            os.close(out_read)
            os.close(err_read)
            raise ToolkitError(
                f"cannot start {argv[0]!r}: no such program.",
                "install it, or put the directory that holds it on PATH",
            ) from None
        finally:
            os.close(out_write)
            os.close(err_write)
        child = _Child(popen, label, rank)
        self.children.append(child)
        self.tree.add_root(popen.pid)
        self.watchdog.watch([popen.pid])
        for fd, stream in ((out_read, "stdout"), (err_read, "stderr")):
            self._read(child, fd, stream)

    def _read(self, child: _Child, fd: int, stream: str) -> None:
        """A thread copying one of the child's pipes to the console and the tails."""
        prefix = Prefixer(f"[{child.label}] ") if child.rank is not None else None

        def echo(text: str) -> None:
            self.console.write(stream, child, prefix(text) if prefix else text)

        if child.rank is None:
            lines: Lines | None = Lines(lambda line: self.tails.line(line, stream))
        else:  # a local rank's tail is its stderr
            lines = Lines(child.tail.append) if stream == "stderr" else None
        reader = threading.Thread(
            target=pump,
            args=(fd,),
            kwargs={"echo": echo if self.echo else None, "lines": lines},
            name=f"toolkit-{child.label}-{stream}",
            daemon=True,
        )
        reader.start()
        child.readers.append(reader)

    def supervise(self) -> LaunchResult:
        preemptible = self.preempt_s is not None
        with _signals_recorded(preemptible) as received:
            try:
                ending = self._watch(received)
            finally:
                self._teardown()
        if signal.SIGTERM in received and not preemptible:
            # The ranks are stopped; now the SIGTERM reaches its real target, this process,
            # with the disposition it had before. Returning a result instead would let a caller
            # that runs many launches (the parity harness) carry on with the next one.
            signal.raise_signal(signal.SIGTERM)
        return self._result(ending)

    def _watch(self, received: set[int]) -> _Ending:
        deadline = None if self.timeout is None else self.started + self.timeout
        while True:
            select.select([self.heartbeats], [], [], POLL_SECONDS)
            self.heartbeats.drain()
            ending = self._children_ending() or self._rank_ending() or self._stall_ending()
            if ending is not None:
                return self._with_silent_ranks(ending)
            if signal.SIGINT in received:
                return _Ending(INTERRUPTED, "interrupted; stopped every rank", by_request=True)
            if self.preempt_s is not None and received & PREEMPTING_SIGNALS:
                ending = self._preemption_ending()
                if ending is not None:
                    return ending
            elif signal.SIGTERM in received:
                return _Ending(SIGNAL_BASE + signal.SIGTERM, "the supervisor got SIGTERM")
            if deadline is not None and time.monotonic() > deadline:
                reason = f"timed out after {self.timeout:g} s"
                return _Ending(TIMED_OUT, reason, by_request=True)

    def _preemption_ending(self) -> _Ending | None:
        """Tell the ranks (toolkit.launch.preemption); their end is then a child's or a rank's
        ending. None until they have had `preempt_s` seconds."""
        assert self.preempt_s is not None
        if self._preemption is None:
            self._preemption = PassOn(self.preempt_s)
        self._preemption.tell(self.heartbeats.ranks.values(), self.hostname)
        if not self._preemption.expired():
            return None
        reason = f"preempted, but the ranks had not saved and stopped {self.preempt_s:g} s "
        reason += "later (checkpoint.preempt_s); stopped the job"
        return _Ending(SIGNAL_BASE + signal.SIGTERM, reason, by_request=True)

    def _children_ending(self) -> _Ending | None:
        """The first child that failed, or a clean end once every child (every launcher, on
        each host it runs on, or every local rank) has exited 0."""
        for child in self.children:
            status = child.popen.poll()
            if status == 0 and child.rank is not None:
                self.heartbeats.mark_ended(child.rank)
            if status is None or status == 0 or self._survived(child, status):
                continue
            if child.rank is None:  # a launcher
                reason = f"{child.label} {describe_status(status)}"
                return _Ending(exit_code(status), reason, launcher_failed=status)
            host = self.placement.get(child.rank, self.hostname)
            how = f"{self._rank(child.rank)} on host {host} {describe_status(status)}"
            return _Ending(exit_code(status), how, child.rank, host)
        if all(child.popen.returncode == 0 or child.rank in self._lost for child in self.children):
            return _Ending(0, "")
        return None

    def _survived(self, child: _Child, status: int) -> bool:
        """A survivable rank's failure, reported once, while another survivable rank is left."""
        if child.rank not in self.survivable:
            return False
        if child.rank not in self._lost:
            if set(self.survivable) <= self._lost | {child.rank}:
                return False  # the last of them: nothing is left to take over its work
            self._lost.add(child.rank)
            self.heartbeats.mark_ended(child.rank)
            host = self.placement.get(child.rank, self.hostname)
            note = f"toolkit launch: {self._rank(child.rank)} on host {host} "
            note += f"{describe_status(status)}; "
            note += f"the job goes on without it ({self.survivable[child.rank]})\n"
            self.console.write("stderr", self, note)
        return True

    def _rank_ending(self) -> _Ending | None:
        """A failure the launcher has not acted on within `grace` seconds."""
        self.watchdog.watch([process.pid for process in self.tree.refresh()])
        launcher = self.children[0] if self.children[0].rank is None else None
        if launcher is None:
            return None
        self._notice_local_ends()
        now = time.monotonic()
        failed = self.heartbeats.first_failure()
        if failed is not None:
            since = self._bad_end_seen.setdefault(failed.rank, now)
            unseen = failed.status is None
            grace = max(self.grace, UNSEEN_END_GRACE_SECONDS) if unseen else self.grace
            if now - since >= grace:
                reason = f"{self._named(failed)} {describe_status(failed.status)}; stopped the job "
                reason += f"({launcher.label} had not ended it {grace:g} s later)"
                return _Ending(exit_code(failed.status), reason, failed.rank, self._host(failed))
        orphan = self.tree.unreaped_failure(self.grace)
        if orphan is not None:
            status, process = orphan
            reason = f"process {process.pid} ({_name(process)}) {describe_status(status)} and "
            reason += f"{launcher.label} did not react for {self.grace:g} s; stopped the job"
            return _Ending(exit_code(status), reason)
        return None

    def _notice_local_ends(self) -> None:
        """Ranks on this machine that are gone without an end report (they did not tag their
        output, or a child of theirs holds it open): their end is seen by their pid. The end
        report is waited for a moment first: it comes in the order the ranks died, which a
        poll of several pids cannot tell."""
        now = time.monotonic()
        for record in self.heartbeats.ranks.values():
            if record.ended or record.host != self.hostname:
                continue
            status = exit_status(record.pid)
            if status is None and pid_running(record.pid):
                continue
            if now - self._dead_since.setdefault(record.rank, now) >= END_REPORT_WAIT_SECONDS:
                self.heartbeats.record_end(record, status)

    def _stall_ending(self) -> _Ending | None:
        if self.stall_timeout is None:
            return None
        now = time.monotonic()
        stalled = self.heartbeats.stalled(now, self.stall_timeout)
        if stalled is None:
            return None
        silence = now - stalled.last_beat
        reason = f"{self._named(stalled)} stalled (no heartbeat for {silence:.0f} s)"
        return _Ending(TIMED_OUT, reason, stalled.rank, self._host(stalled))

    def _with_silent_ranks(self, ending: _Ending) -> _Ending:
        """A failure reported while other ranks had already gone silent names those too."""
        if ending.returncode == 0:
            return ending
        now = time.monotonic()
        silent = [
            record
            for record in self.heartbeats.ranks.values()
            if not record.ended
            and record.rank != ending.rank
            and now - record.last_beat >= SILENT_NOTE_SECONDS
        ]
        if not silent:
            return ending
        named = ", ".join(
            f"{self._named(r)} (no heartbeat for {now - r.last_beat:.0f} s)" for r in silent
        )
        return replace(ending, reason=f"{ending.reason}; already silent: {named}")

    def _teardown(self) -> None:
        self.tree.add_job(self.job_id)
        self.tree.stop(self.grace)
        for child in self.children:
            try:
                child.popen.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                child.popen.kill()
                child.popen.wait()
        for child in self.children:
            for reader in child.readers:
                reader.join(timeout=self.grace)
        remove_leftovers(self.started_at)
        if self.on_teardown is not None:
            self.on_teardown(self.job_id, self.started_at)
        self.console.end_lines()
        self.watchdog.close()
        self.heartbeats.drain()  # the end reports of ranks that died with the launcher
        self.heartbeats.close()

    def _result(self, ending: _Ending) -> LaunchResult:
        """Attach the tails, read only now that the readers are done (the last lines may
        have been in flight). A failed launcher is explained by the rank that failed first."""
        rank, host = ending.rank, ending.host
        returncode, reason = ending.returncode, ending.reason
        if ending.launcher_failed is not None:
            failed = self.heartbeats.first_failure()
            if failed is not None:
                status = failed.status
                if status is None:  # its parent reaped it first; trust a signal the launcher saw
                    status = signal_in(ending.launcher_failed)
                rank, host = failed.rank, self._host(failed)
                returncode = exit_code(status)
                reason = f"{self._named(failed)} {describe_status(status)}; {reason}"
        local = self.children[0].rank is not None
        asked = ending.by_request
        if local:
            culprit = next((c for c in self.children if c.rank == rank), None)
            tail = tuple(culprit.tail) if culprit else ()
            return LaunchResult(returncode, rank, host, reason, tail, by_request=asked)
        tails = self.tails
        return LaunchResult(
            returncode,
            rank,
            host,
            reason,
            tails.of_rank(rank),
            tails.of_launcher(),
            by_request=asked,
        )

    def _host(self, record: RankRecord) -> str:
        """Where the plan put the rank when it decides, else what the rank said."""
        return self.placement.get(record.rank, record.host)

    def _named(self, record: RankRecord) -> str:
        return f"{self._rank(record.rank)} on host {self._host(record)}"

    def _rank(self, rank: int) -> str:
        """ "rank 3", with the rank's role where it has one: "rank 3 (ps 0)"."""
        role = self.roles.get(rank)
        return f"rank {rank}" if role is None else f"rank {rank} ({role})"


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:
        return "?"


@contextmanager
def _signals_recorded(preemptible: bool) -> Iterator[set[int]]:
    """While supervising from the main thread, SIGTERM (a scheduler or `kill` stopping the
    launch) and SIGINT (Ctrl-C) are recorded instead of ending Python at once: the ranks are in
    sessions of their own, so they would outlive the supervisor. A `preemptible` job records
    SIGUSR1 too (Slurm's --signal). Other threads cannot install handlers; there the defaults
    stay."""
    received: set[int] = set()
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    recorded = (signal.SIGTERM, signal.SIGINT, *((signal.SIGUSR1,) if preemptible else ()))
    previous = {
        signum: signal.signal(signum, lambda number, frame: received.add(number))
        for signum in recorded
    }
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
