"""A script in the style of DeepSpeed's examples runs unmodified under `toolkit launch` and under
native `deepspeed --num_gpus 2`, with the same printed result (two real 2-rank runs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.realrun import BIN, ROOT, run
from toolkit.ports import free_port
from toolkit.render.deepspeed import deepspeed_config
from toolkit.spec import load_spec

pytestmark = [
    pytest.mark.multiproc,
    # Open: on this CPU-only machine the script's ranks never get past deepspeed.initialize
    # (also with init_distributed(dist_backend="gloo")), under native `deepspeed --num_gpus 2`
    # and `toolkit launch` alike, so the comparison has not run yet. See the adopt report.
    pytest.mark.skip(reason="ranks hang in deepspeed.initialize under native deepspeed too"),
]

SCRIPT = str(ROOT / "tests" / "scripts" / "ds_example_style.py")


def result_of(output: str) -> dict[str, object]:
    lines = [line[line.find("{") :] for line in output.splitlines() if '"weights_sum"' in line]
    assert len(lines) == 1, output[-3000:]
    return dict(json.loads(lines[0]))


def test_same_result_under_toolkit_launch_and_native_deepspeed(tmp_path: Path) -> None:
    if shutil.which("deepspeed", path=str(BIN)) is None:
        pytest.skip("the deepspeed launcher is not installed")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "backend": "deepspeed",
                "batch": {"micro": 4, "accumulation": 1},
                "optimizer": {"name": "adamw", "lr": 0.01},
                "launch": {"np": 2, "master_port": free_port()},
            }
        )
    )
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(deepspeed_config(load_spec(spec_file))))
    script_args = [SCRIPT, "--deepspeed_config", str(config)]
    toolkit = run([str(BIN / "toolkit"), "launch", "--spec", str(spec_file), "--", *script_args])
    assert toolkit.returncode == 0, toolkit.explain()
    native = run(
        [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()), *script_args]
    )
    assert native.returncode == 0, native.explain()
    under_toolkit, under_native = result_of(toolkit.output), result_of(native.output)
    assert under_toolkit["world"] == 2
    assert under_toolkit == under_native
