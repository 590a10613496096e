"""The benchmarks' pure parts: statistics, the cases and their specs, the bare launch commands,
the reports (JSON -> table, PNG, BENCHMARKS.md) and the CLI's refusals. No process starts."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from toolkit import engines
from toolkit.bench import (
    allreduce,
    allreduce_report,
    bubble,
    cases,
    markdown,
    record,
    stats,
    step_report,
)
from toolkit.bench.bare import BARE, bare_launch
from toolkit.bench.inprocess import resolved
from toolkit.bench.memory import mlp_facts, spec_changes
from toolkit.bench.step import CaseResult, case_spec, parse_setting, variants_for
from toolkit.bench.workload import Workload
from toolkit.cli import main
from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _launches(offsets: list[float], cycles: int, seed: int = 0) -> list[list[float]]:
    """Cycle ratios of launches around 1.02, each launch shifted by its offset (log scale)."""
    rng = np.random.default_rng(seed)
    return [
        list(np.exp(np.log(1.02) + offset + rng.normal(0.0, 0.1, cycles))) for offset in offsets
    ]


def test_launches_that_agree_combine_as_their_pooled_cycles() -> None:
    widths = []
    for seed in range(6):
        launches = _launches([0.0] * 8, 200, seed)
        combined = stats.combine_launches(launches)
        assert combined.n == 8
        assert combined.low <= combined.median <= combined.high
        pooled = stats.spread([ratio for launch in launches for ratio in launch])
        widths.append((combined.ci_high - combined.ci_low) / (pooled.ci_high - pooled.ci_low))
    # Launches that differ only by chance are sometimes read as disagreeing a little (the
    # between-launch variance is estimated), so one run's width may exceed the pooled one's.
    assert 0.8 < float(np.median(widths)) < 1.25


def test_launches_that_disagree_widen_the_interval() -> None:
    agree = stats.combine_launches(_launches([0.0] * 8, 200))
    offsets = [-0.04, 0.04, -0.03, 0.03, -0.02, 0.02, -0.01, 0.01]
    disagree = stats.combine_launches(_launches(offsets, 200))
    assert disagree.ci_high - disagree.ci_low > 2 * (agree.ci_high - agree.ci_low)
    assert disagree.ci_low < 1.02 < disagree.ci_high


def test_launches_without_a_ratio_combine_to_nothing() -> None:
    assert stats.combine_launches([[math.nan], []]).n == 0
    assert stats.combine_launches([[1.1, 1.1, 1.1]]).median == pytest.approx(1.1)


def test_spread_and_ratios() -> None:
    found = stats.spread([1.0, 1.1, 0.9, float("nan")])
    assert found.n == 3 and found.median == pytest.approx(1.0)
    assert found.low == 0.9 and found.high == 1.1
    assert found.low <= found.ci_low <= found.median <= found.ci_high <= found.high
    assert stats.spread([]).n == 0
    assert stats.ratios([2.0, 3.0], [1.0, float("nan")])[0] == 2.0
    assert math.isnan(stats.ratios([2.0, 3.0], [1.0, float("nan")])[1])


def test_alpha_beta_fit_recovers_a_model() -> None:
    sizes = np.array([4096.0 * 4**k for k in range(8)])
    seconds = 50e-6 + sizes / 2e9
    alpha, beta = stats.fit_alpha_beta(sizes, seconds)
    assert alpha == pytest.approx(50e-6, rel=1e-6) and beta == pytest.approx(2e9, rel=1e-6)


def test_every_case_has_a_native_script_and_a_bare_launcher() -> None:
    for case in cases.CASES:
        spec = case_spec(TrainSpec(), case)
        native = cases.native_for(spec)
        assert native.path.is_file(), native.path
        assert spec.launcher in BARE
        assert engines.launcher_refusal(spec.backend, spec.framework_name, spec.launcher) is None


def test_case_spec_pins_the_workload_over_the_users_spec() -> None:
    user = TrainSpec.from_dict(
        {"optimizer": {"name": "adamw"}, "precision": "bf16", "batch": {"accumulation": 4}}
    )
    spec = case_spec(user, cases.CASES[0])
    batch = spec.batch_for()
    assert (batch.global_, batch.micro, batch.accumulation) == (128, 64, 1)
    assert spec.optimizer.name == "sgd" and spec.optimizer.momentum == 0.9
    assert spec.precision == "fp32" and spec.launch.threads_per_rank == 1
    pipeline = next(c for c in cases.CASES if c.name.startswith("pipeline"))
    batch = case_spec(user, pipeline).batch_for()
    assert (batch.global_, batch.micro, batch.accumulation) == (128, 32, 4)


def test_the_benchs_ranks_replace_the_specs_processes() -> None:
    """`--ranks 1` (Workload.ranks) runs one process whatever the user's spec says."""
    ddp = cases.CASES[0]
    one = dataclasses.replace(ddp, workload=dataclasses.replace(ddp.workload, ranks=1))
    spec = case_spec(TrainSpec.from_dict({"launch": {"np": 4}}), one)
    assert spec.launch.np == 1 and spec.batch_for().global_ == 64


def test_workload_counts_the_issues_mlp() -> None:
    assert Workload().parameters == 6_301_194
    assert mlp_facts((512, 2048, 2048, 512, 10)).parameters == 6_301_194


def test_variants_put_native_first_and_add_what_is_asked() -> None:
    labels = [
        v.label
        for v in variants_for(vs_defaults=True, patches=["global-loss"], candidates=["--host-copy"])
    ]
    assert labels == [
        "native",
        "toolkit",
        "native-again",
        "defaults",
        "toolkit+global-loss",
        "native+host-copy",
    ]


def test_floor_is_a_variant_of_its_own_and_splits_the_global_batch_evenly() -> None:
    floor = variants_for(vs_defaults=False, patches=[], candidates=[], floor=True)[-1]
    assert (floor.label, floor.kind) == ("floor", "floor")
    # DDP: 64 samples on each of 2 ranks; the pipeline's 4 x 32 over 2 stages is 64 per rank.
    assert cases.floor_workload(Workload(), 2).micro == 64
    assert cases.floor_workload(cases.PIPELINE_WORKLOAD, 1).micro == 64
    assert cases.floor_workload(cases.PIPELINE_WORKLOAD, 1).micro_batches == 1
    scripts = {
        case.name: cases.floor_for(case_spec(TrainSpec(), case)).name for case in cases.CASES
    }
    assert scripts["ddp/torchrun"] == "floor_torch.py"
    assert scripts["horovod-tf-mpi/horovodrun"] == "floor_tf.py"
    assert all(cases.NATIVE_DIR.joinpath(name).is_file() for name in scripts.values())


def test_settings_become_native_variants_with_their_spec() -> None:
    (variant,) = variants_for(
        vs_defaults=False, patches=[], candidates=[], settings=["horovod.cycle_time_ms=0.1"]
    )[3:]
    assert variant.label == "native@horovod.cycle_time_ms=0.1"
    assert variant.setting == {"horovod": {"cycle_time_ms": 0.1}}
    case = next(c for c in cases.CASES if c.name.startswith("horovod-torch-gloo"))
    assert case_spec(TrainSpec(), case, variant.setting).horovod.cycle_time_ms == 0.1
    with pytest.raises(ToolkitError, match="PATH=VALUE"):
        parse_setting("horovod.cycle_time_ms")


def test_toolkit_settings_become_toolkit_variants_with_their_spec() -> None:
    native, toolkit = variants_for(
        vs_defaults=False,
        patches=[],
        candidates=[],
        settings=["ddp.bucket_cap_mb=4"],
        toolkit_settings=["ddp.bucket_cap_mb=4"],
    )[3:]
    assert (native.label, native.kind) == ("native@ddp.bucket_cap_mb=4", "native")
    assert (toolkit.label, toolkit.kind) == ("toolkit@ddp.bucket_cap_mb=4", "toolkit")
    case = next(c for c in cases.CASES if c.name.startswith("ddp"))
    assert case_spec(TrainSpec(), case, toolkit.setting).ddp.bucket_cap_mb == 4


def test_deepspeed_native_gets_the_toolkits_config(tmp_path: Path) -> None:
    zero2 = next(c for c in cases.CASES if c.name.startswith("zero2"))
    spec = case_spec(TrainSpec(), zero2)
    native = cases.native_for(spec)
    args = native.matched(spec, tmp_path)
    config = json.loads(Path(args[args.index("--ds-config") + 1]).read_text())
    assert config["zero_optimization"]["stage"] == 2 and config["gradient_clipping"] == 0.0
    assert native.defaults(spec, tmp_path) == ["--zero-stage", "2", "--pipeline-stages", "1"]


def test_bare_commands_carry_none_of_the_toolkits_settings() -> None:
    for case in cases.CASES:
        spec = case_spec(TrainSpec(), case)
        launch = bare_launch(spec, "/x/script.py", ["--out", "o.json"])
        words = launch.argv or launch.program
        assert "--fusion-threshold-mb" not in words and "--bind-to" not in words
        assert "--cycle-time-ms" not in words
        for env in launch.rank_envs:
            assert "OMP_NUM_THREADS" not in env and "TF_CONFIG" in env


def test_default_sweep_is_4k_to_64m() -> None:
    assert allreduce.DEFAULT_SIZES[0] == 4096 and allreduce.DEFAULT_SIZES[-1] == 64 << 20
    assert allreduce.FULL_SIZES[-1] == 256 << 20
    assert allreduce.bus_factor(2) == 1.0 and allreduce.bus_factor(8) == 1.75


# The order DeepSpeed's 1F1B schedule runs 4 micro-batches in on 2 stages.
ONE_F_ONE_B = {0: "FFBFBFBB", 1: "FBFBFBFB"}


def _passes(stage: int, forward: float, backward: float) -> list[tuple[str, float]]:
    return [
        ("ForwardPass", forward) if kind == "F" else ("BackwardPass", backward)
        for kind in ONE_F_ONE_B[stage]
    ]


def _timeline(passes: list[tuple[str, float]], *, start: float) -> list[tuple[str, float, float]]:
    """The passes back to back from `start`: (kind, start, end)."""
    timeline = []
    for kind, seconds in passes:
        timeline.append((kind, start, start + seconds))
        start += seconds
    return timeline


def _pipeline_rank(stage: int, *, start: float, compute: float, end: float) -> dict:
    step = {
        "step_s": end - start + 0.01,
        "first_forward_start": start,
        "last_backward_end": end,
        "compute_s": compute,
        "micro_batches": 4,
        "seconds": {"ForwardPass": compute / 3, "BackwardPass": 2 * compute / 3, "RecvGrad": 0.1},
        "passes": _timeline(_passes(stage, compute / 12, compute / 6), start=start),
    }
    return {"rank": stage, "stage": stage, "steps": [step, step, step]}


def test_a_replay_of_equal_passes_without_hand_offs_is_the_formula() -> None:
    """Forward 1 s, backward 2 s on both stages, 4 micro-batches: 15 s, 12 of them busy."""
    window = bubble.replayed_window([_passes(0, 1.0, 2.0), _passes(1, 1.0, 2.0)])
    assert window == pytest.approx(15.0)
    assert 1 - 12.0 / window == pytest.approx(bubble.planned_bubble(2, 4))


def test_a_replay_turns_passes_that_vary_into_waiting() -> None:
    """2 micro-batches; stage 1 computes 6 s either way. Steady (forward 1 s, backward 2 s): 9 s,
    the formula's 1/3 idle. With its first backward pass 4 s and its second 0 s, stage 0 waits
    for the slow one and the fast one cannot give the time back: 10 s."""
    stage_0 = [("ForwardPass", 1.0)] * 2 + [("BackwardPass", 2.0)] * 2
    steady = [("ForwardPass", 1.0), ("BackwardPass", 2.0)] * 2
    uneven = [
        ("ForwardPass", 1.0),
        ("BackwardPass", 4.0),
        ("ForwardPass", 1.0),
        ("BackwardPass", 0.0),
    ]
    assert bubble.replayed_window([stage_0, steady]) == pytest.approx(9.0)
    assert pytest.approx(bubble.planned_bubble(2, 2)) == 1 - 6.0 / 9.0
    assert bubble.replayed_window([stage_0, uneven]) == pytest.approx(10.0)


def test_a_hand_off_is_timed_from_when_its_pass_could_have_started() -> None:
    """Stage 1's first forward starts 0.3 s after stage 0's ended; its second 0.1 s after its
    own backward pass ended, stage 0's forward having ended long before; stage 0's first
    backward 0.2 s after stage 1's."""
    stage_0 = [
        ("ForwardPass", 0.0, 1.0),
        ("ForwardPass", 1.0, 2.0),
        ("BackwardPass", 4.5, 6.5),
        ("BackwardPass", 7.8, 9.8),
    ]
    stage_1 = [
        ("ForwardPass", 1.3, 2.3),
        ("BackwardPass", 2.3, 4.3),
        ("ForwardPass", 4.4, 5.4),
        ("BackwardPass", 5.4, 7.4),
    ]
    delays = bubble.hand_off_delays([stage_0, stage_1])
    # stage 0's first backward pass (0.2) and second (7.8 - 7.4), stage 1's forwards (0.3, 0.1)
    assert sorted(delays) == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_a_replay_of_passes_that_are_not_one_step_is_refused() -> None:
    with pytest.raises(ValueError, match="not one pipeline step"):
        bubble.replayed_window([[("BackwardPass", 1.0)], [("ForwardPass", 1.0)]])


def test_bubble_is_the_idle_share_of_the_common_window() -> None:
    # Stage 0 computes 0.8 s of a 1.0 s window, stage 1 0.6 s of it, starting 0.2 s later.
    ranks = [
        _pipeline_rank(1, start=10.2, compute=0.6, end=11.0),
        _pipeline_rank(0, start=10.0, compute=0.8, end=10.9),
    ]
    result = bubble.summarize(ranks, micro_batches=4)
    assert result["stage_bubbles"] == pytest.approx([0.2, 0.4])
    assert result["measured"] == pytest.approx(0.3)
    assert result["formula"] == pytest.approx(1 / 5)
    assert result["difference"] == pytest.approx(0.1)
    assert result["window_ms"] == pytest.approx(1000.0)
    assert result["stage_compute_per_micro_ms"] == pytest.approx([200.0, 150.0])


def test_stage_costs_predict_the_formula_when_equal_and_more_when_not() -> None:
    for m in (1, 2, 4, 8):
        assert bubble.predicted_from_stage_costs([m * 0.05] * 2, m) == pytest.approx(1 / (m + 1))
    # One micro-batch crosses both stages whatever they cost; after it the slower one paces.
    assert bubble.predicted_from_stage_costs([0.05, 0.06], 1) == pytest.approx(0.5)
    for m in (2, 4, 8):
        assert bubble.predicted_from_stage_costs([m * 0.05, m * 0.06], m) > 1 / (m + 1)


def test_bubble_case_spec_is_a_two_stage_pipeline_of_m_micro_batches() -> None:
    spec = bubble.case_spec(micro_batches=4, micro=8, send_recv="shared_memory")
    batch = spec.batch_for(2)
    assert spec.backend == "deepspeed" and spec.pipeline.stages == 2
    assert (batch.global_, batch.micro, batch.accumulation) == (32, 8, 4)
    assert spec.deepspeed.send_recv == "shared_memory"


def _step_data() -> dict:
    spread = stats.spread([1.01, 1.02]).to_json()
    return {
        "kind": "step",
        "command": "toolkit bench step --spec s.yaml",
        "machine": {
            "date": "2026-01-01T00:00:00",
            "cpus": 2,
            "load_average_start": [1, 1, 1],
            "load_average_end": [2, 2, 2],
        },
        "reps": 2,
        "steps": 3,
        "warmup": 1,
        "cases": [
            {
                "case": "ddp/torchrun",
                "baseline": "native",
                "median_ms": {"native": 60.0, "toolkit": 61.0, "native-again": 60.5},
                "ms": {
                    figure: {"native": [60.0], "toolkit": [61.0], "native-again": [60.5]}
                    for figure in ("median", "p10", "cpu")
                },
                "ratio_to_baseline": {"toolkit": spread, "native-again": spread},
                "p10_ratio_to_baseline": {"toolkit": spread, "native-again": spread},
                "cpu_ratio_to_baseline": {"toolkit": spread, "native-again": spread},
                "toolkit_over_defaults": None,
                "toolkit_over_floor": spread,
                "floor_parts_ms": {"compute": 40.0, "move": 3.5},
                "errors": [],
            }
        ],
    }


def _allreduce_data() -> dict:
    sizes = [4096, 8192]
    series = [
        allreduce.series_record(
            "torch.distributed gloo", "torch-gloo", {"4096": 1e-4, "8192": 1.5e-4}, 2
        ),
        allreduce.series_record(
            "toolkit ddp (gloo)", "toolkit", {"4096": 1.1e-4, "8192": 1.6e-4}, 2
        ),
        allreduce.series_record("memcpy, 1 core", "memcpy", {"4096": 1e-6, "8192": 2e-6}, 2),
    ]
    return {
        "kind": "allreduce",
        "command": "toolkit bench allreduce",
        "machine": _step_data()["machine"],
        "ranks": 2,
        "series": series,
        "toolkit_over_raw_busbw": {"toolkit ddp (gloo)": {str(s): 0.9 for s in sizes}},
        "raw_again_over_raw_spread": {
            "torch.distributed gloo": {str(s): stats.spread([0.995, 1.0]).to_json() for s in sizes}
        },
        "errors": [],
    }


def test_reports_write_tables_pngs_and_markdown(tmp_path: Path) -> None:
    step, sweep = _step_data(), _allreduce_data()
    assert "ddp/torchrun" in step_report.table(step)
    assert "toolkit ddp (gloo)" in allreduce_report.table(sweep)
    assert allreduce_report.table(sweep).splitlines()[-1].split() == [
        *("A/A:", "torch.distributed", "gloo", "0.998", "0.998")
    ]
    png = step_report.plot(step, tmp_path / "step.png")
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    png = allreduce_report.plot(sweep, tmp_path / "allreduce.png")
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    (tmp_path / "step.json").write_text(json.dumps(step))
    (tmp_path / "step-in-process.json").write_text(json.dumps(step))
    (tmp_path / "step-in-process-zero.json").write_text(json.dumps(step))
    (tmp_path / "allreduce.json").write_text(json.dumps(sweep))
    pooled = {**sweep, "launches": {"ddp/mpirun": 16}}
    (tmp_path / "allreduce-resolve.json").write_text(json.dumps(pooled))
    (tmp_path / "findings.md").write_text("## Findings\n\nsomething measured\n")
    pipeline = {
        "kind": "bubble",
        "command": "toolkit bench bubble",
        "machine": step["machine"],
        "model": {"layers": [8, 8, 8], "micro": 4, "stages": 2, "steps": 3},
        "cases": [
            {
                "send_recv": "shared_memory",
                **bubble.summarize(
                    [
                        _pipeline_rank(0, start=0.0, compute=0.8, end=1.0),
                        _pipeline_rank(1, start=0.1, compute=0.7, end=1.0),
                    ],
                    micro_batches=4,
                ),
            }
        ],
        "errors": [],
    }
    assert "0.200" in bubble.table(pipeline)
    assert bubble.plot(pipeline, tmp_path / "bubble.png").read_bytes()[:8] == PNG_SIGNATURE
    (tmp_path / "bubble.json").write_text(json.dumps(pipeline))
    text = markdown.render(tmp_path, image_prefix="docs/bench/")
    assert "| 4 | shared_memory | 0.200 | 0.250 | +0.050 |" in text
    assert "![bubble](docs/bench/bubble.png)" in text
    assert "## Findings" in text and "(docs/bench/step.png)" in text
    assert "| ddp/torchrun | 60.0 | 61.0 | 60.5 |" in text
    # The targets, read from the same files, open the page.
    assert text.index("## Targets") < text.index("## Findings") < text.index("## Figures")
    assert "| toolkit / native step ≤ 1.01 | ddp/torchrun | 1.015 [" in text
    assert "toolkit / floor" in text and "| 40.0 + 3.5 |" in text
    assert "floor = compute + move" in step_report.table(step)
    assert "![allreduce](docs/bench/allreduce.png)" in text
    sweeps = [line for line in text.splitlines() if line.startswith("### Allreduce")]
    assert sweeps == [f"### {title}" for title in markdown.ALLREDUCE_TITLES.values()]
    assert "![allreduce](docs/bench/allreduce-resolve.png)" in text
    assert "Each sweep launched 16 times" in text
    assert "| torch.distributed gloo | 0.998 | 0.998 |" in text
    titles = [line for line in text.splitlines() if line.startswith("### Step")]
    assert titles == [
        "### Step: toolkit vs native in the same processes (the adapter's cost)",
        "### Step: toolkit vs native, launch by launch (and the engines' own defaults)",
        "### Step in the same processes, more engines: zero",
    ]


def test_report_command_writes_benchmarks_md(tmp_path: Path) -> None:
    directory = tmp_path / "docs" / "bench"
    directory.mkdir(parents=True)
    (directory / "step.json").write_text(json.dumps(_step_data()))
    target = tmp_path / "BENCHMARKS.md"
    assert main(["bench", "report", "--dir", str(directory), "--to", str(target)]) == 0
    assert "(docs/bench/step.png)" in target.read_text()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bench", "step", "--all", "--cases", "nothing-matches"], "--cases ['nothing-matches']"),
        (["bench", "step", "--patch", "no-such-patch"], "--patch 'no-such-patch'"),
        (["bench", "allreduce", "--sweeps", "nothing-matches"], "--sweeps ['nothing-matches']"),
        (["bench", "memory", "--cases", "nothing-matches"], "--cases ['nothing-matches']"),
        (["bench", "bubble", "--layers", "16,8"], "--layers 16,8: 1 layer cannot fill 2"),
        (
            ["bench", "step", "--all", "--cases", "pipeline", "--ranks", "3"],
            "--ranks 3: case pipeline2x4/deepspeed has 2 pipeline stages",
        ),
    ],
)
def test_cli_refuses_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("backend: ddp\n")
    if argv[1] == "step":
        argv = [*argv[:2], "--spec", str(spec), *argv[2:]]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("toolkit: error: " + says) and len(error.splitlines()) == 1


def test_memory_bench_takes_and_names_only_what_the_spec_changes() -> None:
    spec = TrainSpec.from_dict(
        {
            "backend": "deepspeed",
            "optimizer": {"name": "sgd", "momentum": 0.9},
            "zero": {"stage": 3, "reduce_bucket_size": 4_000_000},
            "launch": {"np": 2},
        }
    ).to_dict()
    assert spec_changes(spec) == {
        "optimizer": {"name": "sgd", "momentum": 0.9},
        "zero": {"stage": 3, "reduce_bucket_size": 4_000_000},
    }
    assert spec_changes(TrainSpec().to_dict()) == {}


def test_a_run_that_measured_nothing_leaves_the_last_result_in_place(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    assert record.write_measured(path, {"cases": [1]}, measured=True)
    assert not record.write_measured(path, {"cases": [], "errors": ["x"]}, measured=False)
    assert json.loads(path.read_text()) == {"cases": [1]}
    assert not record.write_measured(tmp_path / "new.json", {}, measured=False)
    assert not (tmp_path / "new.json").exists()


def test_a_step_case_is_measured_when_any_launch_gave_a_time() -> None:
    result = CaseResult("ddp", {}, ["native", "toolkit"])
    result.add("native", {})
    result.add("toolkit", {})
    assert not result.measured
    result.add("toolkit", {"step_s": [0.05, 0.06]})
    assert result.measured


def _in_process_result(toolkit_ms: list[float], cycles: list[int]) -> CaseResult:
    result = CaseResult("ddp", {}, ["native", "toolkit"], figures={"median": {}, "cpu": {}})
    result.extend("native", [0.1] * len(toolkit_ms), [0.1] * len(toolkit_ms), [])
    result.extend("toolkit", [ms / 1e3 for ms in toolkit_ms], [0.1] * len(toolkit_ms), [])
    result.launch_cycles = cycles
    return result


def test_an_in_process_run_keeps_its_cycles_launch_by_launch() -> None:
    result = _in_process_result([101, 103, 102, 110, 90, 110, 110], [3, 1, 3])
    assert result.launch_cycle_ratios("toolkit") == [
        pytest.approx([1.01, 1.03, 1.02]),
        pytest.approx([1.10]),
        pytest.approx([0.90, 1.10, 1.10]),
    ]
    found = result.to_json()
    assert found["launch_cycles"] == [3, 1, 3]
    assert found["combined_ratio_to_baseline"]["toolkit"]["n"] == 3


def test_toolkit_over_a_variant_is_taken_launch_by_launch_too() -> None:
    result = CaseResult(
        "ddp", {}, ["native", "toolkit", "floor"], figures={"median": {}, "cpu": {}}
    )
    result.extend("native", [0.1] * 4, [0.1] * 4, [3] * 4)
    result.extend("toolkit", [0.12, 0.12, 0.13, 0.15], [0.1] * 4, [0, 0, 1, 5])
    result.extend("floor", [0.1, 0.1, 0.1, 0.1], [0.1] * 4, [])
    result.launch_cycles = [2, 2]
    assert result.launch_cycle_ratios("toolkit", over="floor") == [
        pytest.approx([1.2, 1.2]),
        pytest.approx([1.3, 1.5]),
    ]
    assert result.to_json()["combined_toolkit_over_floor"]["n"] == 2
    assert result.to_json()["toolkit_over_floor"]["n"] == 4
    # Faults per step are each step's count (in-process); a variant without any is NaN.
    faults = result.to_json()["faults_per_step"]
    assert faults["native"] == 3 and faults["toolkit"] == 0.5 and math.isnan(faults["floor"])
    launch_by_launch = CaseResult("ddp", {}, ["native", "toolkit", "floor"])
    assert launch_by_launch.to_json()["combined_toolkit_over_floor"] is None


def test_a_toolkit_variant_is_also_taken_over_the_toolkits_own_step_beside_it() -> None:
    """A patched or set variant against the toolkit, cycle by cycle: 110 ms beside 100 is 1.10
    whatever native did in those cycles (here native jumps between launches)."""
    labels = ["native", "toolkit", "toolkit+a-patch", "toolkit@zero.stage=1"]
    result = CaseResult("zero1", {}, labels, figures={"median": {}, "cpu": {}})
    result.extend("native", [0.05, 0.05, 0.2, 0.2], [0.1] * 4, [])
    result.extend("toolkit", [0.1, 0.1, 0.2, 0.2], [0.1] * 4, [])
    result.extend("toolkit+a-patch", [0.11, 0.11, 0.22, 0.22], [0.1] * 4, [])
    result.extend("toolkit@zero.stage=1", [0.1, 0.1, 0.2, 0.2], [0.1] * 4, [])
    result.launch_cycles = [2, 2]
    over = result.to_json()["over_toolkit"]
    assert set(over) == {"toolkit+a-patch", "toolkit@zero.stage=1"}
    assert over["toolkit+a-patch"]["median"] == pytest.approx(1.10)
    assert over["toolkit+a-patch"]["n"] == 2  # launches, combined
    assert over["toolkit@zero.stage=1"]["median"] == pytest.approx(1.0)
    data = {**_step_data(), "kind": "step-in-process", "cases": [result.to_json()]}
    section = "\n".join(markdown.step_section(data, "Patched", "p.png"))
    assert "| case | toolkit+a-patch / toolkit | toolkit@zero.stage=1 / toolkit |" in section
    assert "| zero1 | 1.100 [" in section
    plain = CaseResult("ddp", {}, ["native", "toolkit", "native-again"])
    assert plain.to_json()["over_toolkit"] == {}


def test_a_ratio_is_resolved_only_over_enough_launches_that_agree() -> None:
    steady = _in_process_result([101.0, 101.1, 100.9, 101.0, 101.05] * 2, [2] * 5)
    assert resolved(steady, 0.01)
    assert not resolved(steady, 0.0001)
    too_few = _in_process_result([101.0] * 8, [2] * 4)
    assert not resolved(too_few, 0.01)
    scattered = _in_process_result([100, 100, 110, 110, 95, 95, 120, 120, 101, 101], [2] * 5)
    assert not resolved(scattered, 0.01)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--resolve", "0.01"], "--resolve 0.01: resolves toolkit / native over the launches"),
        (["--in-process", "--resolve", "0.01", "--reps", "5", "--max-reps", "3"], "--max-reps 3"),
    ],
)
def test_resolve_asks_for_what_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("backend: ddp\n")
    assert main(["bench", "step", "--spec", str(spec), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_resolve_is_a_fraction(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["bench", "step", "--spec", "x.yaml", "--in-process", "--resolve", "1.5"])
    assert stop.value.code == 2
    assert "must be between 0 and 1" in capsys.readouterr().err


def wait_quietly(handles: list[object]) -> None:
    """This module's stand-in for the Horovod torch backend module's wait (see below)."""
    raise AssertionError("the patch should have replaced this wait")


class _BackendOfThisModule:
    """A backend class whose module is this one, as the horovod-own-wait patch finds the
    backend's module through the class."""


def test_the_horovod_own_wait_patch_skips_the_toolkits_wait_and_puts_it_back() -> None:
    from toolkit.bench import patches

    run = type("Run", (), {"backend": _BackendOfThisModule()})()
    with patches.applied(run, "horovod-own-wait"):
        assert wait_quietly([object()]) is None
    with pytest.raises(AssertionError, match="should have replaced"):
        wait_quietly([])


class DeepSpeedZeroOptimizer:
    """Named as DeepSpeed's ZeRO-1/2 optimizer, which the deepspeed-bucket patch resizes and
    the deepspeed-multi-rank-allreduce and deepspeed-grad-norm patches switch."""

    reduce_bucket_size = 1 << 22
    use_multi_rank_bucket_allreduce = False
    compute_grad_norm = False


def _deepspeed_run(optimizer: object) -> object:
    engine = type("Engine", (), {"optimizer": optimizer})()
    return type("Run", (), {"backend": type("Backend", (), {"engine": engine})()})()


def test_the_deepspeed_bucket_patch_sizes_zero_1_2s_bucket_as_deepspeed_and_puts_it_back() -> None:
    from toolkit.bench import patches

    optimizer = DeepSpeedZeroOptimizer()
    with patches.applied(_deepspeed_run(optimizer), "deepspeed-bucket"):
        assert optimizer.reduce_bucket_size == 500_000_000
    assert optimizer.reduce_bucket_size == 1 << 22


def test_the_multi_rank_allreduce_patch_sets_deepspeeds_default_and_puts_the_specs_back() -> None:
    from toolkit.bench import patches

    optimizer = DeepSpeedZeroOptimizer()
    with patches.applied(_deepspeed_run(optimizer), "deepspeed-multi-rank-allreduce"):
        assert optimizer.use_multi_rank_bucket_allreduce is True
    assert optimizer.use_multi_rank_bucket_allreduce is False


def test_the_grad_norm_patch_sets_deepspeeds_default_and_puts_the_specs_back() -> None:
    from toolkit.bench import patches

    optimizer = DeepSpeedZeroOptimizer()
    with patches.applied(_deepspeed_run(optimizer), "deepspeed-grad-norm"):
        assert optimizer.compute_grad_norm is True
    assert optimizer.compute_grad_norm is False


@pytest.mark.parametrize(
    "patch", ["deepspeed-bucket", "deepspeed-multi-rank-allreduce", "deepspeed-grad-norm"]
)
def test_the_zero_1_2_patches_refuse_the_other_stages(patch: str) -> None:
    from toolkit.bench import patches

    stage3 = type("DeepSpeedZeroOptimizer_Stage3", (), {"reduce_bucket_size": 1 << 22})()
    with (
        pytest.raises(RuntimeError, match=f"{patch}: for ZeRO-1/2"),
        patches.applied(_deepspeed_run(stage3), patch),
    ):
        pass


def test_a_benchs_context_names_the_commit_and_the_minutes_it_ran() -> None:
    context = record.machine()
    finished = record.finish(context)
    assert "started" not in finished and finished["minutes"] >= 0
    # The tests run from a git checkout, so the commit is known.
    assert len(finished["commit"].removesuffix("+changes")) == 12
    json.dumps(finished)  # what every bench writes must be JSON
    if "cpu family" in Path("/proc/cpuinfo").read_text():
        assert " family " in finished["cpu"] and " model " in finished["cpu"]


def test_a_one_size_allreduce_run_is_plotted_launch_by_launch(tmp_path: Path) -> None:
    size = str(64 << 20)
    launches = [
        {"raw": {size: [1.0, 1.0, 1.0]}, "toolkit": {size: [1.0, 0.98, 1.02]}},
        {"raw": {size: [1.1, 1.0, 1.2, 1.3]}, "toolkit": {size: [1.0, 1.0, 1.0, 1.0]}},
    ]
    figures = allreduce.launch_medians(launches, "raw", "toolkit")[size]
    # The launches' figures are the ones the pooled ratio weighs: medians on the log scale.
    assert figures == pytest.approx([1.0, (1.1 * 1.2) ** 0.5])
    pooled = allreduce.paired_ratios(launches, "raw", "toolkit")[size]
    assert (pooled["low"], pooled["high"]) == pytest.approx((min(figures), max(figures)))
    series = [allreduce.series_record("toolkit ddp (gloo)", "toolkit", {size: 0.03}, 2)]
    data = {
        **_allreduce_data(),
        "series": series,
        "toolkit_over_raw_spread": {"toolkit ddp (gloo)": {size: pooled}},
        "toolkit_over_raw_launches": {"toolkit ddp (gloo)": {size: figures}},
        "raw_again_over_raw_launches": {},
        "launches": {"ddp/mpirun": 2},
    }
    assert math.isnan(series[0]["alpha_us"]) and "alpha" not in allreduce_report.table(data)
    (tmp_path / "allreduce-resolve.json").write_text(json.dumps(data))
    text = markdown.render(tmp_path, image_prefix="")
    assert "| path | 64 MiB |" in text and "alpha" not in text
    [(label, spread, each)] = allreduce_report.launch_rows(data)
    assert (label, each, spread["n"]) == ("toolkit ddp (gloo)", figures, 2)
    png = allreduce_report.plot(data, tmp_path / "allreduce-resolve.png")
    assert png.read_bytes()[:8] == PNG_SIGNATURE
