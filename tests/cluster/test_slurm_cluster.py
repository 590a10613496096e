"""The single-machine Slurm is real: `srun` starts ranks, `sbatch` jobs run to completion and
write their output, and the toolkit's own `toolkit config sbatch` script runs under it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.slurm import SlurmCluster
from tests.realrun import ROOT, json_objects

PROBE = str(Path(__file__).with_name("probe_rank.py"))
PROBE_IN_TREE = "tests/cluster/probe_rank.py"
RUN_BOUND_S = 60
JOB_BOUND_S = 120

pytestmark = [pytest.mark.cluster, pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]


def job_env(cluster: SlurmCluster) -> dict[str, str]:
    """The toolkit from this tree in every task (sbatch and srun pass the environment on)."""
    env = cluster.env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        argv,
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_BOUND_S,
        check=False,
    )
    assert done.returncode == 0, f"{argv}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def submit(cluster: SlurmCluster, script: Path, output: Path) -> list[dict[str, Any]]:
    """sbatch the script, wait for the job to end, and return the JSON lines it printed."""
    job_id = run(["sbatch", "--parsable", f"--output={output}", str(script)], job_env(cluster))
    state = cluster.wait_for_job(job_id.strip().split(";")[0], bound_s=JOB_BOUND_S)
    printed = output.read_text() if output.exists() else "(no output file)"
    assert state == "COMPLETED", f"job ended {state}:\n{printed}"
    return json_objects(printed)


def by_rank(reports: list[dict[str, Any]], variable: str = "SLURM_PROCID") -> dict[int, Any]:
    """Each rank's report, keyed by the rank the launcher gave it in `variable`."""
    ranks = {int(r["env"][variable]): r for r in reports}
    assert len(ranks) == len(reports), f"two reports for one rank: {reports}"
    return ranks


def test_srun_starts_two_ranks(slurm_cluster: SlurmCluster) -> None:
    out = run(["srun", "-n2", sys.executable, PROBE], job_env(slurm_cluster))
    ranks = by_rank(json_objects(out))
    assert sorted(ranks) == [0, 1]
    assert {r["env"]["SLURM_NTASKS"] for r in ranks.values()} == {"2"}
    assert {r["env"]["SLURM_JOB_NODELIST"] for r in ranks.values()} == {slurm_cluster.node}


def test_toolkit_detects_srun(slurm_cluster: SlurmCluster) -> None:
    argv = ["srun", "-n2", sys.executable, "-m", "toolkit.launch.probe"]
    reports = json_objects(run(argv, job_env(slurm_cluster)))
    seen = sorted((r["launcher"], r["rank"], r["world_size"], r["local_rank"]) for r in reports)
    assert seen == [("srun", 0, 2, 0), ("srun", 1, 2, 1)]
    assert {tuple(r["hosts"]) for r in reports} == {(slurm_cluster.node,)}


def test_sbatch_job_writes_its_output_and_completes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --ntasks=2\nsrun {sys.executable} {PROBE} batch\n")
    reports = submit(slurm_cluster, script, tmp_path / "out.txt")
    assert sorted(by_rank(reports)) == [0, 1]
    assert {tuple(r["argv"]) for r in reports} == {("batch",)}


def toolkit_sbatch(cluster: SlurmCluster, tmp_path: Path, spec: dict[str, Any]) -> Path:
    """`toolkit config sbatch` for the spec, running probe_rank.py with two arguments."""
    spec_file = tmp_path / "train.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    script = tmp_path / "job.sh"
    render = [sys.executable, "-m", "toolkit", "config", "sbatch", "--spec", str(spec_file)]
    render += ["-o", str(script), "--", PROBE_IN_TREE, "--note", "two words"]
    run(render, job_env(cluster))
    return script


def test_toolkit_sbatch_script_runs_ddp_ranks_under_srun(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    launch = {"launcher": "srun", "np": 2, "python": sys.executable, "job_name": "tk-test"}
    launch["env"] = {"TOOLKIT_FROM_SPEC": "a value with spaces"}
    script = toolkit_sbatch(slurm_cluster, tmp_path, {"backend": "ddp", "launch": launch})
    ranks = by_rank(submit(slurm_cluster, script, tmp_path / "out.txt"))
    assert sorted(ranks) == [0, 1]
    for report in ranks.values():
        assert report["argv"] == ["--note", "two words"]
        env = report["env"]
        assert env["SLURM_NTASKS"] == "2"
        assert env["MASTER_ADDR"] == slurm_cluster.node
        assert env["MASTER_PORT"] == "29500"
        assert env["OMP_NUM_THREADS"] == "1"
        assert env["TOOLKIT_FROM_SPEC"] == "a value with spaces"


def test_toolkit_sbatch_script_runs_horovod_ranks_under_mpirun(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Inside the allocation mpirun starts its daemons with srun: both ranks inherit the
    batch step's SLURM_PROCID, so the rank is OMPI_COMM_WORLD_RANK."""
    launch = {"launcher": "mpirun", "np": 2, "python": sys.executable}
    spec = {"backend": "horovod", "horovod": {"controller": "mpi"}, "launch": launch}
    script = toolkit_sbatch(slurm_cluster, tmp_path, spec)
    reports = submit(slurm_cluster, script, tmp_path / "out.txt")
    ranks = by_rank(reports, "OMPI_COMM_WORLD_RANK")
    assert sorted(ranks) == [0, 1]
    for report in ranks.values():
        assert report["argv"] == ["--note", "two words"]
        assert report["env"]["OMPI_COMM_WORLD_SIZE"] == "2"
        assert report["env"]["HOROVOD_CONTROLLER"] == "mpi"
