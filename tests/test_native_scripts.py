"""A DeepSpeed script taken as it is (tests/scripts/deepspeed_native.py: DeepSpeed's documented
idiom, no toolkit inside) runs under `toolkit launch` with a spec imported from its own
DeepSpeed config, exactly as under the native `deepspeed` launcher: `--local_rank=N` arrives
and agrees with LOCAL_RANK, both ranks train and end with the same weights."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.realrun import BIN, ROOT, json_objects, rank_env
from toolkit.ports import free_port

pytestmark = pytest.mark.multiproc

SCRIPT = str(ROOT / "tests" / "scripts" / "deepspeed_native.py")
DS_CONFIG = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
}
"""No optimizer section: the script brings its own (imported as `optimizer.name: script`).
DeepSpeed's own Adam would be built on first use here, minutes on 2 cores."""
RUN_BOUND_S = 420


def test_an_unmodified_deepspeed_script_runs_under_toolkit_launch(tmp_path: Path) -> None:
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(DS_CONFIG))
    spec = tmp_path / "spec.yaml"
    toolkit = str(BIN / "toolkit")
    imported = [toolkit, "spec", "from-deepspeed", str(config), "--world-size", "2"]
    subprocess.run([*imported, "-o", str(spec)], check=True, timeout=120, cwd=tmp_path)
    port = str(free_port())
    launch = [toolkit, "launch", "--spec", str(spec), "--timeout", str(RUN_BOUND_S), "--"]
    script = [SCRIPT, "--deepspeed", "--deepspeed_config", str(config)]
    done = subprocess.run(
        [*launch, *script],
        cwd=tmp_path,
        env={**rank_env(), "MASTER_PORT": port},
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
