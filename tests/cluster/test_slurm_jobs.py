"""Real training under the single-machine Slurm: `toolkit config sbatch` scripts submitted with
`sbatch` for engines started by srun or by mpirun inside the allocation, and `toolkit launch`
inside `salloc`, which takes the allocation's task count.

Each job trains the README's digits example for one epoch on 2 ranks; it must complete, print
its metrics for 2 ranks, and both ranks must report the same weights. By default a
representative subset runs (DeepSpeed under srun, Horovod under mpirun);
`TOOLKIT_CLUSTER=full` runs every engine × launcher pair in FULL.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.slurm import SlurmCluster
from tests.cluster.test_slurm_cluster import job_env, submit
from tests.options import FULL_CLUSTER
from tests.realrun import ROOT, SPECS, json_objects

pytestmark = [pytest.mark.cluster, pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]

SUBSET = [("zero2", "srun"), ("horovod_mpi", "mpirun")]
FULL = [
    *SUBSET,
    ("tf_multiworker", "srun"),
    ("ddp", "srun"),
    ("fsdp", "srun"),
    ("ddp", "mpirun"),
    ("pipeline", "srun"),
    ("horovod_tf", "mpirun"),
    ("tf_multiworker", "mpirun"),
]
CASES = FULL if FULL_CLUSTER else SUBSET
SALLOC_BOUND_S = 300
# The example the README runs, for one epoch; its accuracy bar is not what is tested here.
EXAMPLE_ARGS = ["--epochs", "1", "--min-accuracy", "0"]


def write_spec(name: str, launcher: str, directory: Path, *, np: int | None) -> Path:
    spec: dict[str, Any] = yaml.safe_load((SPECS / f"{name}.yaml").read_text())
    spec["launch"] = {"launcher": launcher, "python": sys.executable}
    if np is not None:
        spec["launch"]["np"] = np
    if "horovod" in spec:
        spec["horovod"]["controller"] = "mpi"  # ranks under mpirun are MPI processes
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def example_command(spec: dict[str, Any], spec_file: Path) -> list[str]:
    script = "tf_digits.py" if spec["backend"] == "tf" or "framework" in spec else "torch_digits.py"
    return [str(ROOT / "hvd_examples" / script), "--spec", str(spec_file), *EXAMPLE_ARGS]


def check_two_ranks_agree(reports: list[dict[str, Any]], printed: str) -> None:
    metrics = [r for r in reports if "world_size" in r]
    digests = {r["rank"]: r["weights_sha256"] for r in reports if "weights_sha256" in r}
    assert [m["world_size"] for m in metrics] == [2], printed[-3000:]
    assert sorted(digests) == [0, 1], printed[-3000:]
    assert digests[0] == digests[1], "the ranks ended with different weights"


@pytest.mark.parametrize(("name", "launcher"), CASES, ids=["-".join(case) for case in CASES])
def test_sbatch_script_trains_on_two_ranks(
    slurm_cluster: SlurmCluster, tmp_path: Path, name: str, launcher: str
) -> None:
    spec_file = write_spec(name, launcher, tmp_path, np=2)
    spec = yaml.safe_load(spec_file.read_text())
    script = tmp_path / "job.sh"
    render = [sys.executable, "-m", "toolkit", "config", "sbatch", "--spec", str(spec_file)]
    render += ["-o", str(script), "--", *example_command(spec, spec_file)]
    subprocess.run(render, env=job_env(slurm_cluster), cwd=ROOT, check=True, timeout=120)
    output = tmp_path / "out.txt"
    reports = submit(slurm_cluster, script, output)
    check_two_ranks_agree(reports, output.read_text())


def test_toolkit_launch_inside_salloc_uses_the_allocation(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The spec fixes no process count: `salloc -n 2` decides, as for `srun script`."""
    spec_file = write_spec("ddp", "srun", tmp_path, np=None)
    spec = yaml.safe_load(spec_file.read_text())
    toolkit = [sys.executable, "-m", "toolkit", "launch", "--spec", str(spec_file), "--"]
    done = subprocess.run(
        ["salloc", "-n", "2", *toolkit, *example_command(spec, spec_file)],
        env=job_env(slurm_cluster),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SALLOC_BOUND_S,
        check=False,
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-3000:]
    assert "np 2 from the Slurm allocation (SLURM_NTASKS)" in done.stderr
    check_two_ranks_agree(json_objects(done.stdout), printed)
