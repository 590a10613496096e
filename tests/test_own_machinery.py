"""With no transport or allocator setting, every torch engine runs on its own machinery.

Each case starts a real 2-rank job under `toolkit launch` and the engine's launcher; every
rank trains a step and reports (tests/scripts/own_machinery.py) that nothing of the engine was
replaced: DDP over its Gloo group with no comm hook, DeepSpeed's own communication backend
(`deepspeed.comm.comm.cdb`) and the pipeline engine's own schedule, Horovod's own wait, and
the environment without allocator settings.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realrun import BIN, ROOT, json_objects, rank_env
from toolkit.ports import free_port

pytestmark = [pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]

SCRIPT = str(ROOT / "tests" / "scripts" / "own_machinery.py")
CASES: dict[str, dict[str, Any]] = {
    "ddp/torchrun": {"backend": "ddp", "launch": {"launcher": "torchrun"}},
    "zero2/deepspeed": {"backend": "deepspeed", "zero": {"stage": 2}},
    "pipeline/deepspeed": {
        "backend": "deepspeed",
        "parallel": {"pipeline": 2},
        "batch": {"global": 64, "micro": 16},
    },
    "horovod/horovodrun": {"backend": "horovod", "horovod": {"controller": "gloo"}},
}


@pytest.mark.parametrize("name", CASES)
def test_the_engine_runs_on_its_own_machinery(name: str, tmp_path: Path) -> None:
    spec = {"batch": {"global": 64}, **CASES[name]}
    spec["launch"] = {**spec.get("launch", {}), "np": 2, "master_port": free_port()}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {key: value for key, value in rank_env().items() if key != "GLIBC_TUNABLES"}
    result = subprocess.run(
        [str(BIN / "toolkit"), "launch", "--spec", str(path), "--", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=420,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    reports = sorted(
        (r for r in json_objects(result.stdout) if "rank" in r), key=lambda r: r["rank"]
    )
    assert [r["rank"] for r in reports] == [0, 1], output[-3000:]
    for report in reports:
        assert report["torch_all_reduce_is_torchs"], report
        assert report["no_glibc_tunables"], report
        assert report["shadowed_methods"] == [], report
        if report["backend"] == "ddp":
            assert report["process_group"] == "gloo" and report["comm_hooks"] == 0, report
        if report["backend"] == "deepspeed":
            assert report["cdb_is_deepspeeds"] and report["process_group"] == "gloo", report
        if report["backend"] == "horovod":
            assert report["synchronize_is_horovods"], report
