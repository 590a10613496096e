"""Scripts taken as they are, written in the engines' own idioms with no toolkit inside, give
the same output under `toolkit launch` as under their native launcher: every rank's losses and
final weights, bit for bit.

- tests/scripts/deepspeed_native.py (DeepSpeed's documented idiom: `--local_rank` checked
  against LOCAL_RANK, `--deepspeed_config`, the script's own optimizer) under `deepspeed` and
  under `toolkit launch` with a spec imported from the script's own DeepSpeed config;
- tests/scripts/horovod_native.py (Horovod's example idiom: `hvd.init()` first, lr scaled by
  the workers, DistributedOptimizer, rank 0's state broadcast) under `horovodrun` and under
  `toolkit launch` with a Horovod spec.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.realrun import BIN, PYTHON, ROOT, json_objects, rank_env
from toolkit.launch.shm_leftovers import leftovers, remove_leftovers
from toolkit.ports import free_port

pytestmark = pytest.mark.multiproc

SCRIPTS = ROOT / "tests" / "scripts"
DS_CONFIG = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
}
"""No optimizer section: the script brings its own (imported as `optimizer.name: script`).
DeepSpeed's own Adam would be built on first use here, minutes on 2 cores."""
HOROVOD_SPEC = """\
backend: horovod
optimizer: {name: script}
horovod: {controller: gloo}
launch: {launcher: horovodrun, np: 2}
"""
RUN_BOUND_S = 420


def run_job(argv: list[str], where: Path) -> dict[int, dict[str, Any]]:
    """Each rank's JSON report from a whole job, which must succeed."""
    done = subprocess.run(
        argv,
        cwd=where,
        env={**rank_env(), "MASTER_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=RUN_BOUND_S + 60,
        check=False,
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-4000:]
    assert "Mismatch in local rank" not in printed
    reports = {r["rank"]: r for r in json_objects(done.stdout) if "weights_sha256" in r}
    assert sorted(reports) == [0, 1], printed[-4000:]
    assert reports[0]["weights_sha256"] == reports[1]["weights_sha256"]
    assert all(r["last_loss"] < r["first_loss"] for r in reports.values()), reports
    return reports


def toolkit_launch(spec: Path) -> list[str]:
    return [str(BIN / "toolkit"), "launch", "--spec", str(spec), "--timeout", str(RUN_BOUND_S)]


def test_a_deepspeed_script_gives_the_same_output_under_both_launchers(tmp_path: Path) -> None:
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(DS_CONFIG))
    spec = tmp_path / "spec.yaml"
    imported = [str(BIN / "toolkit"), "spec", "from-deepspeed", str(config), "--world-size", "2"]
    subprocess.run([*imported, "-o", str(spec)], check=True, timeout=120, cwd=tmp_path)
    ds_args = ["--deepspeed", "--deepspeed_config", str(config)]
    script = [str(SCRIPTS / "deepspeed_native.py"), *ds_args]
    started = time.time()
    try:
        native = run_job([str(BIN / "deepspeed"), "--num_gpus", "2", *script], tmp_path)
        # DeepSpeed's CPU accelerator leaves a 66 MiB /dev/shm buffer per rank behind. Those of
        # the deepspeed launcher's run go here; the toolkit's job removes its own
        # (toolkit/launch/shm_leftovers.py).
        assert remove_leftovers(started)
        under_toolkit = run_job([*toolkit_launch(spec), "--", *script], tmp_path)
        assert under_toolkit == native
        assert leftovers(started) == []
    finally:
        remove_leftovers(started)


def test_a_horovod_script_gives_the_same_output_under_both_launchers(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(HOROVOD_SPEC)
    script = [str(SCRIPTS / "horovod_native.py"), "--lr", "0.01"]
    horovodrun = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PYTHON]
    native = run_job([*horovodrun, *script], tmp_path)
    under_toolkit = run_job([*toolkit_launch(spec), "--", PYTHON, *script], tmp_path)
    assert under_toolkit == native
