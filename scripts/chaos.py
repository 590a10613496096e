"""Chaos soak (`scripts/soak.py --chaos`): each engine's 2-rank job with `launch.max_restarts`,
hit at a random moment by a fault, must finish with the weights of the run that lost nothing.

For each engine, one uninterrupted run gives the reference weights; then every job is the same
run (tests/scripts/resume_torch.py or resume_tf.py under `toolkit launch`, a checkpoint every
--every steps) with one fault at a random moment of its steps, on a random rank or host; the
jobs take the kinds in turn:

- kill: SIGKILL to a random rank, as a crashed process or node;
- stop: SIGSTOP to a random rank, as a hung one (the job ends at `timeouts.stall_s`);
- cut: the link of a random host goes down for a while (`ddp-hosts` only: DDP on two network
  namespace hosts, tests/cluster/netns.py, where root can make them), as a flaky switch.

Rank 0 writes "PID STEP" after every step (--progress), so the soak knows the step each fault
hit and when the restarted job trained its first step. Per engine the report gives: jobs
finished, final weights bitwise equal to the reference (same engine and world size), steps
redone (the fault's step minus the step resumed from), and restart time (from the fault to the
restarted job's first step).

    .venv/bin/python scripts/soak.py --chaos --out docs/soak/chaos
    .venv/bin/python scripts/soak.py --chaos --jobs 1 --engines ddp --out /tmp/chaos
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from toolkit.bench import report
from toolkit.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the namespace hosts of tests/cluster
BIN = Path(sys.executable).parent
TORCH_SCRIPT = ROOT / "tests" / "scripts" / "resume_torch.py"
TF_SCRIPT = ROOT / "tests" / "scripts" / "resume_tf.py"
RANK_VARIABLES = ("TOOLKIT_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK")
STALL_S = 6.0
CUT_S = STALL_S + 4.0
"""How long a cut link stays down: past the stall, so the job ends and restarts."""
JOB_BOUND_S = 600.0


@dataclass(frozen=True)
class Engine:
    lines: str
    script: Path = TORCH_SCRIPT
    hosts: bool = False
    """On two namespace hosts (then `cut` is among the faults)."""


ENGINES = {
    "ddp": Engine("backend: ddp"),
    "horovod": Engine("backend: horovod"),
    "zero2": Engine("backend: deepspeed\nzero: {stage: 2}"),
    "tf-multiworker": Engine("backend: tf", TF_SCRIPT),
    "ddp-hosts": Engine("backend: ddp\nlaunch: {launcher: torchrun}", hosts=True),
}


@dataclass(frozen=True)
class Job:
    """One run's settings, shared by the reference and the chaos jobs of an engine."""

    engine: Engine
    spec: Path
    steps: int
    step_seconds: float

    def argv(self, out: Path, progress: Path) -> list[str]:
        launch = [str(BIN / "toolkit"), "launch", "--spec", str(self.spec), "--"]
        script = [str(self.engine.script), "--spec", str(self.spec), "--steps", str(self.steps)]
        extra = ["--out", str(out), "--progress", str(progress)]
        return [*launch, *script, *extra, "--step-seconds", str(self.step_seconds)]


def write_spec(where: Path, engine: Engine, every: int, launch: dict[str, Any]) -> Path:
    spec: dict[str, Any] = yaml.safe_load(engine.lines)
    spec |= {
        "seed": 3,
        "batch": {"global": 64, "micro": 16},
        "optimizer": {"name": "adam", "lr": 0.01},
        "checkpoint": {"dir": str(where / "checkpoints"), "every_steps": every, "keep": 2},
        "timeouts": {"stall_s": STALL_S, "collective_s": 600},
    }
    spec["launch"] = {**spec.get("launch", {}), **launch, "master_port": free_port()}
    if spec["backend"] == "tf":
        spec["tf"] = {"port": free_port()}
    path = where / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def progress_of(path: Path) -> tuple[int, int] | None:
    """(pid, step) of rank 0's last note, None before the first."""
    with contextlib.suppress(OSError, ValueError):
        pid, step = path.read_text().split()
        return int(pid), int(step)
    return None


def rank_processes(job: Job) -> dict[int, psutil.Process]:
    """Rank -> the process running the job's script with its spec, here or on a namespace
    host (those share this machine's processes): a process whose program is the script and
    whose environment names its rank, not the launcher or agent around it."""
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, IndexError):
            command = process.cmdline()
            arguments = [part for part in command[1:] if not part.startswith("-")]
            if arguments[0] != str(job.engine.script) or str(job.spec) not in command:
                continue
            env = process.environ()
            for variable in RANK_VARIABLES:
                if variable in env:
                    found[int(env[variable])] = process
                    break
    return found


def wait_for_step(progress: Path, job: subprocess.Popen[bytes], step: int) -> tuple[int, int]:
    deadline = time.monotonic() + JOB_BOUND_S
    while time.monotonic() < deadline and job.poll() is None:
        seen = progress_of(progress)
        if seen is not None and seen[1] >= step:
            return seen
        time.sleep(0.02)
    raise RuntimeError(f"the job did not reach step {step} (status {job.poll()})")


def run_job(
    job: Job, where: Path, fault: str | None, rng: random.Random, hosts: Any
) -> dict[str, Any]:
    """One run; with `fault`, that fault at a random step. What happened, as a record."""
    out, progress, log = where / "weights.npz", where / "progress", where / "job.log"
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            job.argv(out, progress), cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT
        )
    record: dict[str, Any] = {"fault": fault}
    try:
        if fault is not None:
            record |= inject(job, process, progress, fault, rng, hosts)
        status = process.wait(timeout=JOB_BOUND_S)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        process.kill()
        status = process.wait()
        record["error"] = str(error)
    record |= {"status": status, "seconds": round(time.monotonic() - started, 1)}
    record["restarts"] = log.read_text(errors="replace").count("toolkit launch: restart ")
    if status != 0:
        record["tail"] = "\n".join(log.read_text(errors="replace").splitlines()[-12:])
    return record


def inject(
    job: Job,
    process: subprocess.Popen[bytes],
    progress: Path,
    fault: str,
    rng: random.Random,
    hosts: Any,
) -> dict[str, Any]:
    """The fault at a random step between the first and the last fifth of the run; then the
    step it hit, the restarted job's first step and the time to it."""
    at = rng.randint(1, max(1, job.steps * 4 // 5))
    pid, _ = wait_for_step(progress, process, at)
    victim = rng.randrange(2)
    hit_at = time.monotonic()
    if fault == "cut":
        address = hosts.ssh.hosts[victim]
        hosts.network.cut(address)
        time.sleep(CUT_S)
        hosts.network.mend(address)
    else:
        ranks = rank_processes(job)
        if victim not in ranks:
            raise RuntimeError(f"rank {victim} not found among {sorted(ranks)}")
        ranks[victim].send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    last = progress_of(progress)
    hit = last[1] if last is not None and last[0] == pid else at
    deadline = time.monotonic() + JOB_BOUND_S
    while time.monotonic() < deadline and process.poll() is None:
        seen = progress_of(progress)
        if seen is not None and seen[0] == pid:
            hit = max(hit, seen[1])
        elif seen is not None:
            return {
                "rank": victim,
                "hit_step": hit,
                "resumed_step": seen[1] - 1,
                "steps_redone": hit - (seen[1] - 1),
                "restart_s": round(time.monotonic() - hit_at, 1),
            }
        time.sleep(0.02)
    return {"rank": victim, "hit_step": hit}


def weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as saved:
        return {name: saved[name] for name in saved.files}


def identical(path: Path, reference: dict[str, np.ndarray]) -> bool:
    if not path.exists():
        return False
    mine = weights(path)
    return set(mine) == set(reference) and all(
        np.array_equal(mine[name], value) for name, value in reference.items()
    )


@contextlib.contextmanager
def namespace_hosts(wanted: bool, root: Path) -> Iterator[Any]:
    """Two namespace hosts when `wanted` and root can make them, else None."""
    if not wanted:
        yield None
        return
    from tests.cluster.netns import start_namespace_cluster
    from tests.cluster.processes import ClusterUnavailable

    try:
        with start_namespace_cluster(root, 2) as cluster:
            yield cluster
    except ClusterUnavailable as missing:
        print(f"ddp-hosts skipped: {missing}", file=sys.stderr)
        yield None


def soak_engine(name: str, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    engine = ENGINES[name]
    with tempfile.TemporaryDirectory(prefix=f"chaos-{name}-") as scratch:
        root = Path(scratch)
        with namespace_hosts(engine.hosts, root) as hosts:
            if engine.hosts and hosts is None:
                return {"engine": name, "skipped": "no namespace hosts"}
            launch: dict[str, Any] = {"np": 2, "max_restarts": 2}
            if hosts is not None:
                launch = {"max_restarts": 2, **hosts.launch_section()}
                launch["hosts"] = [f"{address}:1" for address in hosts.ssh.hosts]
                launch["interface"] = "tknet"
            faults = ["kill", "stop", "cut"] if hosts is not None else ["kill", "stop"]
            reference_dir = root / "reference"
            reference_dir.mkdir()
            spec = write_spec(reference_dir, engine, args.every, launch)
            job = Job(engine, spec, args.steps, args.step_seconds)
            reference_run = run_job(job, reference_dir, None, rng, hosts)
            if reference_run["status"] != 0:
                return {"engine": name, "reference_failed": reference_run}
            reference = weights(reference_dir / "weights.npz")
            jobs = []
            for index in range(args.jobs):
                where = root / f"job{index}"
                where.mkdir()
                spec = write_spec(where, engine, args.every, launch)
                job = Job(engine, spec, args.steps, args.step_seconds)
                fault = faults[index % len(faults)]
                record = run_job(job, where, fault, rng, hosts)
                record["identical"] = identical(where / "weights.npz", reference)
                jobs.append(record)
                print(f"{name} job {index + 1}: {json.dumps(record)[:300]}", flush=True)
    return {"engine": name, "reference_seconds": reference_run["seconds"], "jobs": jobs}


def summary(result: dict[str, Any]) -> list[str]:
    jobs = result.get("jobs")
    if jobs is None:
        return [result["engine"], "-", "-", "-", "-", "-", result.get("skipped", "failed")]
    kinds = dict.fromkeys(j["fault"] for j in jobs)
    faults = ", ".join(f"{kind} {sum(j['fault'] == kind for j in jobs)}" for kind in kinds)
    redone = [j["steps_redone"] for j in jobs if "steps_redone" in j]
    restart = [j["restart_s"] for j in jobs if "restart_s" in j]
    return [
        result["engine"],
        f"{sum(j['status'] == 0 for j in jobs)} of {len(jobs)}",
        f"{sum(j['identical'] for j in jobs)} of {len(jobs)}",
        faults,
        " ".join(str(r) for r in redone) or "-",
        f"{statistics.median(restart):.0f} ({min(restart):.0f}-{max(restart):.0f})"
        if restart
        else "-",
        "",
    ]


def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    results = [soak_engine(name, args, rng) for name in args.engines]
    header = [
        "engine",
        "finished",
        "weights equal",
        "faults",
        "steps redone",
        "restart s: median (range)",
        "note",
    ]
    rows = [summary(result) for result in results]
    command = ["scripts/soak.py", *sys.argv[1:]]
    machine = report.machine()
    record = {"command": command, "machine": machine, "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps(record, indent=1) + "\n")
    caption = (
        f"`{' '.join(command)}` on {machine['cores']} cores, {machine['date']}: per engine "
        f"{args.jobs} jobs of {args.steps} steps (2 ranks, a checkpoint every {args.every}, "
        f"`max_restarts: 2`, `stall_s: {STALL_S:g}`), one random fault each. Every job: "
        "chaos.json.\n\n"
    )
    (out / "CHAOS.md").write_text(
        "# Chaos soak\n\n" + caption + report.markdown_table(header, rows)
    )
    print(report.text_table(header, rows))
    everything = [j for r in results for j in r.get("jobs", [])]
    failed = any(j["status"] != 0 or not j["identical"] for j in everything)
    return 1 if failed or any("reference_failed" in r for r in results) else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="soak.py --chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--chaos", action="store_true", required=True)
    parser.add_argument("--engines", nargs="*", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--jobs", type=int, default=3, help="chaos jobs per engine")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=10, help="checkpoint.every_steps")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="sleep after each step")
    parser.add_argument("--seed", type=int, default=0, help="of the faults' draws")
    parser.add_argument("--out", default="reports/chaos")
    return parser.parse_args(argv)
