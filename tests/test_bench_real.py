"""The benchmarks run for real at tiny sizes and write well-formed JSON and PNG.

Tiny: an MLP of a few hundred parameters, 2 timed steps, 1 repetition, messages of a few KiB.
Nothing here asserts a time: only that every launch produced a finite figure and the files
are what they claim to be.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.options import FULL_MATRIX
from toolkit.cli import main

pytestmark = pytest.mark.multiproc

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_bench_step_tiny(tmp_path: Path, no_orphans: None) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("backend: ddp\n")
    out = tmp_path / "out"
    argv = ["bench", "step", "--spec", str(spec), "--reps", "1", "--steps", "2", "--warmup", "1"]
    argv += ["--floor", "--layers", "16,8,4", "--micro", "4", "--out", str(out)]
    assert main(argv) == 0
    data = json.loads((out / "step.json").read_text())
    (case,) = data["cases"]
    assert case["errors"] == []
    assert set(case["median_ms"]) == {"native", "toolkit", "native-again", "floor"}
    assert all(math.isfinite(ms) and ms > 0 for ms in case["median_ms"].values())
    assert math.isfinite(case["ratio_to_baseline"]["toolkit"]["median"])
    assert math.isfinite(case["toolkit_over_floor"]["median"])
    assert all(ms > 0 for ms in case["floor_parts_ms"].values())
    # Rank 0's page faults per step: counted for every variant (a count, so 0 is a value).
    assert set(case["faults_per_step"]) == set(case["median_ms"])
    assert all(math.isfinite(count) and count >= 0 for count in case["faults_per_step"].values())
    assert data["workloads"][case["case"]]["layers"] == [16, 8, 4]
    assert (out / "step.png").read_bytes()[:8] == PNG_SIGNATURE


# The floor's model in plain torch, and with TOOLKIT_MATRIX=full in plain TF too
IN_PROCESS = ["ddp", "tf"] if FULL_MATRIX else ["ddp"]


@pytest.mark.parametrize("backend", IN_PROCESS)
def test_bench_step_in_process_tiny(tmp_path: Path, no_orphans: None, backend: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"backend: {backend}\n")
    out = tmp_path / "out"
    argv = ["bench", "step", "--spec", str(spec), "--in-process", "--reps", "1", "--steps", "2"]
    argv += ["--warmup", "1", "--layers", "16,8,4", "--micro", "4", "--out", str(out)]
    # No 2 launches resolve a ratio to a millionth: --resolve adds one launch past --reps, and
    # --max-reps stops it there.
    argv += ["--resolve", "0.000001", "--max-reps", "2", "--floor"]
    assert main(argv) == 0
    (case,) = json.loads((out / "step.json").read_text())["cases"]
    assert case["errors"] == []
    variants = {"native", "toolkit", "native-again", "toolkit+global-loss", "floor"}
    assert set(case["median_ms"]) == variants
    assert all(math.isfinite(ms) and ms > 0 for ms in case["median_ms"].values())
    assert len(case["launch_cycles"]) == 2
    combined = case["combined_ratio_to_baseline"]["toolkit"]
    assert combined["n"] == 2 and combined["ci_low"] <= combined["median"] <= combined["ci_high"]
    assert case["toolkit_over_floor"]["n"] == len(case["ms"]["median"]["toolkit"])  # cycles
    assert case["combined_toolkit_over_floor"]["n"] == 2
    assert math.isfinite(case["combined_toolkit_over_floor"]["median"])
    assert all(ms > 0 for ms in case["floor_parts_ms"].values())


def test_bench_allreduce_tiny(tmp_path: Path, no_orphans: None) -> None:
    out = tmp_path / "out"
    argv = ["bench", "allreduce", "--sizes", "4K", "16K", "--blocks", "1", "--sweeps", "ddp"]
    assert main([*argv, "--launches", "2", "--out", str(out)]) == 0
    data = json.loads((out / "allreduce.json").read_text())
    assert data["launches"] == {"ddp/mpirun": 2}
    labels = {series["label"] for series in data["series"]}
    assert {"torch.distributed gloo", "mpi4py (Open MPI)", "toolkit ddp (gloo)"} <= labels
    for series in data["series"]:
        assert series["sizes"] == [4096, 16384]
        assert all(math.isfinite(bw) and bw > 0 for bw in series["busbw_gbs"]), series
    assert set(data["toolkit_over_raw_busbw"]["toolkit ddp (gloo)"]) == {"4096", "16384"}
    spread = data["toolkit_over_raw_spread"]["toolkit ddp (gloo)"]["4096"]
    # Two launches pooled. In each, --blocks 1 is rounded up to a whole round (6 paths, memcpy
    # and the raw path's A/A among them, each behind each of the 5 others once) and to a whole
    # turn of the 5 buffers' places in memory: 5 rounds.
    assert (
        spread["n"] == 2
        and spread["ci_low"] <= spread["median"] <= spread["ci_high"]
        and spread["median"] == data["toolkit_over_raw_busbw"]["toolkit ddp (gloo)"]["4096"]
    )
    each = data["toolkit_over_raw_launches"]["toolkit ddp (gloo)"]["4096"]
    assert len(each) == 2 and (spread["low"], spread["high"]) == pytest.approx(
        (min(each), max(each))
    )
    again = data["raw_again_over_raw_spread"]["torch.distributed gloo"]
    assert set(again) == {"4096", "16384"} and again["4096"]["n"] == 2
    assert (out / "allreduce.png").read_bytes()[:8] == PNG_SIGNATURE


# One case, two launches (module list, then the measurement): DDP, and with TOOLKIT_MATRIX=full
# ZeRO-3, whose reductions the probe reaches through deepspeed.comm. The other engines' memory is
# `toolkit bench memory`'s.
MEMORY_CASES = ["ddp/torchrun", "zero3/deepspeed"] if FULL_MATRIX else ["ddp/torchrun"]


@pytest.mark.parametrize("case_name", MEMORY_CASES)
def test_bench_memory_tiny(tmp_path: Path, no_orphans: None, case_name: str) -> None:
    out = tmp_path / "out"
    argv = ["bench", "memory", "--cases", case_name, "--layers", "64,32,10", "--micro", "4"]
    assert main([*argv, "--out", str(out)]) == 0
    cases = json.loads((out / "memory.json").read_text())["cases"]
    assert [case["case"] for case in cases] == [case_name]
    for case in cases:
        # Tensor bytes, not time: AdamW's two fp32 moments per parameter (plus step counters).
        assert case["optimizer_state"]["ratio"] == pytest.approx(1.0, rel=0.05)
        assert case["resident"]["at_step_delta"] > 0
        assert case["measured"]["not_preloaded"] == []
        assert case["measured"]["at_step_where"].startswith("step ")


# The toolkit's mailboxes; with TOOLKIT_MATRIX=full both transports in turn, Gloo first (the
# bench's default), one launch each.
BUBBLE_TRANSPORTS = ["gloo", "shared_memory"] if FULL_MATRIX else ["shared_memory"]


def test_bench_bubble_tiny(tmp_path: Path, no_orphans: None) -> None:
    out = tmp_path / "out"
    argv = ["bench", "bubble", "--micro-batches", "2", "--layers", "16,16,16", "--micro", "4"]
    argv += ["--send-recv", *BUBBLE_TRANSPORTS]
    assert main([*argv, "--steps", "2", "--out", str(out)]) == 0
    data = json.loads((out / "bubble.json").read_text())
    assert [(case["micro_batches"], case["send_recv"]) for case in data["cases"]] == [
        (2, transport) for transport in BUBBLE_TRANSPORTS
    ]
    for case in data["cases"]:
        assert case["stages"] == 2 and len(case["steps"]) == 2
        # Idle shares of a window that holds the compute: between 0 and 1, whatever the timing.
        assert all(0.0 <= b < 1.0 for b in case["stage_bubbles"]), case["stage_bubbles"]
        assert case["instruction_ms"]["ForwardPass"][0] > 0
        # The replay without hand-offs cannot take longer than the step did, and no pass starts
        # before its input's pass has ended.
        assert 0.0 <= case["replayed_without_hand_offs"] <= case["measured"] + 1e-9
        assert case["hand_off_ms"] >= 0.0
    assert (out / "bubble.png").read_bytes()[:8] == PNG_SIGNATURE


def test_bench_all_smoke_runs_through_to_its_report(tmp_path: Path, no_orphans: None) -> None:
    """The one command that regenerates BENCHMARKS.md, every bench and launch-again in it at
    tiny sizes: each writes the file the targets read, and the report names each file."""
    from toolkit.bench import runs, targets

    spec = tmp_path / "spec.yaml"
    spec.write_text("backend: ddp\n")
    out, report = tmp_path / "out", tmp_path / "BENCHMARKS.md"
    argv = ["bench", "all", "--smoke", "--spec", str(spec), "--dir", str(out), "--to", str(report)]
    assert main(argv) == 0
    written = {path.name for path in out.glob("*.json")}
    assert set(runs.all_runs(str(spec), 1, str(out))) <= written
    # Each target's rows name the file they were read from: the headline's, or the file of
    # its launch-again where that one measured them.
    text = report.read_text()
    launched_again = {run.headline: run.name for run in targets.RESOLVING_RUNS}
    for name, _ in targets.READERS:
        assert f"`{name}`" in text or f"`{launched_again.get(name)}`" in text, name
    assert (out / "plan.txt").read_text().strip()
