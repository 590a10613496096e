"""The bench commands run through to their reports with real engines at tiny sizes.

They measure nothing here (a few steps on a busy machine); what is checked is that each launch
happens under the spec's real launcher and that the JSON, the table and the plot are written
with a figure for every spec and size.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.realrun import SPECS
from toolkit.cli import main

pytestmark = [pytest.mark.multiproc, pytest.mark.usefixtures("no_orphans")]

TINY = ["--reps", "1", "--steps", "2", "--warmup", "1"]


def test_bench_step_times_toolkit_and_native_side_by_side(tmp_path: Path) -> None:
    assert (
        main(["bench", "step", "--spec", str(SPECS / "ddp.yaml"), *TINY, "--out", str(tmp_path)])
        == 0
    )
    (case,) = json.loads((tmp_path / "step.json").read_text())["cases"]
    assert case["name"] == "ddp+torch/torchrun"
    assert len(case["ms"]["native"]) == len(case["ms"]["toolkit"]) == 1
    assert math.isfinite(case["ratio"]) and case["ratio"] > 0
    assert "toolkit / native" in (tmp_path / "step.md").read_text()


def test_bench_compare_gives_one_row_per_spec(tmp_path: Path) -> None:
    """With `--link lo` every row also counts what the step sent: both ranks talk over
    loopback, and each sends at least its gradients (676 fp32 numbers) a step."""
    sgd = tmp_path / "ddp_sgd.yaml"
    sgd.write_text(
        "backend: ddp\nbatch: {global: 32, micro: 16}\n"
        "optimizer: {name: sgd, lr: 0.01, momentum: 0.9}\nlaunch: {np: 2}\n"
    )
    specs = ["--spec", str(sgd), "--spec", str(SPECS / "horovod.yaml")]
    out = tmp_path / "out"
    link = ["--link", "lo"]
    argv = ["bench", "compare", *specs, "--layers", "16,32,4", *TINY, *link, "--out", str(out)]
    assert main(argv) == 0
    rows = json.loads((out / "compare.json").read_text())["specs"]
    assert [row["spec"] for row in rows] == ["ddp_sgd", "horovod"]
    assert all(row["peak_rss_bytes"] > 0 and len(row["toolkit_ms"]) == 1 for row in rows)
    assert rows[0]["ratio"] > 0  # plain SGD in fp32: the native DDP script runs the same step
    assert rows[1]["ratio"] is None  # Adam: no native script runs that step
    assert (out / "compare.png").stat().st_size > 0
    assert all(row["sent_bytes_per_step"][0] >= 676 * 4 for row in rows)
    assert "MB/step sent" in (out / "compare.md").read_text()


def test_bench_allreduce_reports_every_size(tmp_path: Path) -> None:
    argv = ["bench", "allreduce", "--spec", str(SPECS / "ddp.yaml"), "--sizes", "4K", "64K"]
    assert main([*argv, "--repeats", "2", "--out", str(tmp_path)]) == 0
    (result,) = json.loads((tmp_path / "allreduce.json").read_text())["results"]
    assert sorted(result["seconds"], key=int) == ["4096", "65536"]
    assert all(len(times) == 2 and min(times) > 0 for times in result["seconds"].values())
