"""The targets table at the top of BENCHMARKS.md: verdicts read from the benches' JSON."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from toolkit.bench import runs, stats, targets
from toolkit.units import MIB

MACHINE = {"date": "2026-11-28T06:00:00+00:00", "cpus": 2, "load_average_start": [1, 1, 1]}


def _spread(median: float, low: float, high: float) -> dict[str, Any]:
    return {"median": median, "low": low, "high": high, "ci_low": low, "ci_high": high, "n": 5}


def _step_case(name: str, backend: str, framework: str | None, **ratios: Any) -> dict[str, Any]:
    return {
        "case": name,
        "spec": {"backend": backend, "framework": framework},
        "ratio_to_baseline": {},
        **ratios,
    }


def test_a_ratio_is_met_only_when_its_whole_interval_is_inside_the_bound() -> None:
    assert targets.verdict_at_most(_spread(1.004, 0.99, 1.009), 1.01) == targets.MET
    assert targets.verdict_at_most(_spread(1.004, 0.99, 1.02), 1.01) == targets.MEDIAN_ONLY
    assert targets.verdict_at_most(_spread(1.02, 1.001, 1.03), 1.01) == targets.MISSED
    nan = math.nan
    assert targets.verdict_at_most(_spread(nan, nan, nan), 1.01) == targets.NOT_RUN


def test_a_figure_without_an_interval_is_met_or_missed_by_its_distance() -> None:
    assert targets.verdict_within(0.96, 1.0, 0.05) == targets.MET
    assert targets.verdict_within(0.94, 1.0, 0.05) == targets.MISSED
    assert targets.verdict_within(0.14, 0.111, 0.03) == targets.MET
    assert targets.verdict_within(0.15, 0.111, 0.03) == targets.MISSED


def test_the_adapter_is_judged_over_launches_where_the_run_kept_them() -> None:
    cycles = _spread(1.005, 1.0, 1.009)
    launches = _spread(1.012, 1.0, 1.03)
    case = _step_case(
        "ddp/torchrun",
        "ddp",
        None,
        ratio_to_baseline={"toolkit": cycles, "native-again": cycles},
        launch_ratio_to_baseline={"toolkit": launches, "native-again": _spread(1.0, 0.98, 1.02)},
    )
    [row] = targets.adapter_rows({"cases": [case]}, "step-in-process.json")
    assert row.verdict == targets.MISSED
    assert row.figure == "1.012 [1.000, 1.030]; A/A 1.000 [0.980, 1.020]"
    case.pop("launch_ratio_to_baseline")
    [row] = targets.adapter_rows({"cases": [case]}, "step-in-process.json")
    assert row.verdict == targets.MET


def test_the_floor_takes_each_frameworks_best_case() -> None:
    data = {
        "cases": [
            _step_case("ddp/torchrun", "ddp", None, toolkit_over_floor=_spread(1.27, 1.2, 1.3)),
            _step_case(
                "horovod-torch-mpi/horovodrun",
                "horovod",
                None,
                toolkit_over_floor=_spread(1.46, 1.3, 1.6),
            ),
            _step_case("tf-mwms/local", "tf", None, toolkit_over_floor=_spread(1.66, 1.6, 1.7)),
            _step_case(
                "horovod-tf-mpi/horovodrun",
                "horovod",
                "tensorflow",
                toolkit_over_floor=_spread(1.21, 1.12, 1.32),
            ),
        ]
    }
    rows = list(targets.floor_rows(data, "step-floor.json"))
    assert [row.target for row in rows] == [
        "best tensorflow choice / physical floor ≤ 1.25",
        "best torch choice / physical floor ≤ 1.25",
    ]
    assert [(row.subject, row.verdict) for row in rows] == [
        ("horovod-tf-mpi/horovodrun", targets.MEDIAN_ONLY),
        ("ddp/torchrun", targets.MISSED),
    ]


def test_the_allreduce_compares_the_toolkits_in_place_path_where_there_is_one() -> None:
    size = str(64 * MIB)
    data = {
        "toolkit_over_raw_busbw": {
            "toolkit ddp (gloo)": {size: 0.58},
            "toolkit ddp (gloo), in place": {size: 1.07},
            "toolkit tf (ring)": {size: 0.97},
        }
    }
    rows = {row.subject: row for row in targets.allreduce_rows(data, "allreduce.json")}
    assert rows["toolkit ddp (gloo), in place"].verdict == targets.MET
    assert "toolkit ddp (gloo)" not in rows
    assert rows["toolkit tf (ring)"].verdict == targets.MISSED
    assert rows["toolkit horovod (MPI), in place"].verdict == targets.NOT_RUN


def allreduce_spread(median: float, low: float, high: float) -> dict[str, Any]:
    """A ratio's spread as the allreduce bench writes it, its interval from `low` to `high`."""
    return {"median": median, "low": low, "high": high, "ci_low": low, "ci_high": high, "n": 9}


def test_the_allreduce_is_judged_with_its_interval_where_the_run_kept_one() -> None:
    size = str(64 * MIB)

    data = {
        "toolkit_over_raw_busbw": {},
        "toolkit_over_raw_spread": {
            "toolkit ddp (gloo), in place": {size: allreduce_spread(1.001, 0.985, 1.02)},
            "toolkit horovod (MPI), in place": {size: allreduce_spread(0.99, 0.95, 1.03)},
            "toolkit tf (ring)": {size: allreduce_spread(0.97, 0.96, 0.99)},
        },
    }
    rows = {row.subject: row for row in targets.allreduce_rows(data, "allreduce.json")}
    assert rows["toolkit ddp (gloo), in place"].verdict == targets.MET
    assert rows["toolkit ddp (gloo), in place"].figure == "1.001 [0.985, 1.020]"
    assert rows["toolkit horovod (MPI), in place"].verdict == targets.MEDIAN_ONLY
    assert rows["toolkit tf (ring)"].verdict == targets.MISSED
    assert rows["toolkit horovod (Gloo), in place"].verdict == targets.NOT_RUN


def _launch(raw: list[float], toolkit: list[float]) -> dict[str, dict[str, list[float]]]:
    return {"raw": {"4096": raw}, "toolkit": {"4096": toolkit}}


def test_the_allreduce_ratio_pairs_the_blocks_of_the_same_round() -> None:
    from toolkit.bench.allreduce import paired_ratios

    # The toolkit's second block ran while the machine was busy, and so did the raw one of the
    # same round: their ratio is 1 like the others, where the ratio of medians would read 0.75.
    busy = [_launch([1.0, 4.0, 1.0], [1.0, 4.0, 1.0])]
    spread = paired_ratios(busy, "raw", "toolkit")["4096"]
    assert (spread["median"], spread["low"], spread["high"], spread["n"]) == (1.0, 1.0, 1.0, 1)
    halves = paired_ratios([_launch([2.0, 2.0], [1.0, 4.0])], "raw", "toolkit")["4096"]
    assert halves["median"] == pytest.approx(1.0)  # ratios 2 and 1/2: the middle on a log scale


def test_the_allreduce_ratio_pools_launches_and_widens_when_they_disagree() -> None:
    from toolkit.bench.allreduce import paired_ratios

    # Each launch is sure of its own figure (every block agrees); the launches are not.
    fast, slow = _launch([1.1] * 5, [1.0] * 5), _launch([0.9] * 5, [1.0] * 5)
    spread = paired_ratios([fast, slow], "raw", "toolkit")["4096"]
    assert spread["n"] == 2
    assert (spread["low"], spread["high"]) == pytest.approx((0.9, 1.1))
    assert spread["median"] == pytest.approx((1.1 * 0.9) ** 0.5)
    assert spread["ci_low"] < 0.95 and spread["ci_high"] > 1.05
    agreeing = paired_ratios([fast, fast], "raw", "toolkit")["4096"]
    assert agreeing["ci_high"] - agreeing["ci_low"] == pytest.approx(0.0, abs=1e-4)


def test_the_allreduce_row_shows_the_raw_paths_a_a_beside_the_toolkits_ratio() -> None:
    size = str(64 * MIB)

    data = {
        "toolkit_over_raw_busbw": {},
        "toolkit_over_raw_spread": {
            "toolkit ddp (gloo), in place": {size: allreduce_spread(1.0, 0.99, 1.01)}
        },
        "raw_again_over_raw_spread": {
            "torch.distributed gloo": {size: allreduce_spread(0.97, 0.9, 1.05)}
        },
    }
    rows = {row.subject: row for row in targets.allreduce_rows(data, "allreduce.json")}
    figure = rows["toolkit ddp (gloo), in place"].figure
    assert figure == "1.000 [0.990, 1.010]; A/A 0.970 [0.900, 1.050]"


def test_the_bubble_is_read_for_the_toolkits_own_hand_offs() -> None:
    def case(send_recv: str, measured: float) -> dict[str, Any]:
        return {
            "send_recv": send_recv,
            "stages": 2,
            "micro_batches": 8,
            "formula": 1 / 9,
            "measured": measured,
            "difference": measured - 1 / 9,
        }

    data = {"cases": [case("gloo", 0.2), case("shared_memory", 0.14)]}
    [row] = targets.bubble_rows(data, "bubble.json")
    assert (row.subject, row.verdict) == ("2 stages, m = 8", targets.MET)
    assert row.figure == "0.140 against 0.111 (+0.029)"


def test_memory_gives_one_row_per_case_for_the_state_and_for_the_plan() -> None:
    def case(name: str, state: float, resident: float) -> dict[str, Any]:
        return {
            "case": name,
            "optimizer_state": {"ratio": state},
            "resident": {"ratio": resident},
        }

    data = {"cases": [case("zero3/deepspeed", 1.0, 1.0), case("horovod/horovodrun", 1.0, 0.92)]}
    verdicts = [(row.subject, row.verdict) for row in targets.memory_rows(data, "memory.json")]
    assert verdicts == [
        ("zero3/deepspeed", targets.MET),
        ("horovod/horovodrun", targets.MET),
        ("zero3/deepspeed", targets.MET),
        ("horovod/horovodrun", targets.MISSED),
    ]


def test_the_section_counts_verdicts_and_is_empty_without_the_files() -> None:
    assert targets.section({}) == []
    assert targets.section({"allreduce-other.json": {"machine": MACHINE}}) == []
    defaults = {
        "machine": MACHINE,
        "cases": [
            _step_case(
                "zero2/deepspeed",
                "deepspeed",
                None,
                toolkit_over_defaults=stats.spread([0.7, 0.8, 0.85]).to_json(),
            ),
            _step_case("ddp/torchrun", "ddp", None, toolkit_over_defaults=None),
        ],
    }
    other = {"machine": {**MACHINE, "date": "2026-11-01T00:00:00+00:00"}}
    lines = targets.section({"step-vs-defaults.json": defaults, "settings-x.json": other})
    assert lines[0] == "## Targets"
    assert "(run 2026-11-28): 1 met, 1 not run." in lines[2]
    assert any("| zero2/deepspeed | 0.800 [" in line and "| met |" in line for line in lines)
    assert any("| ddp/torchrun | - | **not run** |" in line for line in lines)
    # Each row names its file and the day that file's run began.
    assert lines[-2].endswith("| `step-vs-defaults.json`, 2026-11-28 |")


def test_every_target_is_read_from_a_file_bench_all_writes() -> None:
    commands = runs.all_runs("spec.yaml", 3, "out")
    assert sorted(name for name, _ in targets.READERS) == sorted(commands)
    for name, argv in commands.items():
        if "--name" in argv:  # a step run names its file; the others write their own
            assert f"{argv[argv.index('--name') + 1]}.json" == name


def _adapter_run(date: str, ratio: float, layers: str = "512,2048") -> dict[str, Any]:
    case = _step_case(
        "zero0/deepspeed",
        "deepspeed",
        None,
        combined_ratio_to_baseline={"toolkit": _spread(ratio, ratio - 0.005, ratio + 0.005)},
    )
    return {
        "machine": {**MACHINE, "date": date},
        "workloads": {"zero0/deepspeed": {"layers": layers}},
        "cases": [case],
    }


def test_a_newer_resolving_run_of_the_same_workload_replaces_its_cases_rows() -> None:
    headline = _adapter_run("2026-11-28T06:00:00+00:00", 1.028)
    newer = _adapter_run("2026-11-29T06:00:00+00:00", 1.002)
    [row] = targets.rows({"step-in-process.json": headline, targets.RESOLVING_RUN: newer})
    assert row.verdict == targets.MET
    assert row.source == f"`{targets.RESOLVING_RUN}`, 2026-11-29"
    older = _adapter_run("2026-11-27T06:00:00+00:00", 1.002)
    other_model = _adapter_run("2026-11-29T06:00:00+00:00", 1.002, layers="16,8")
    for resolving in (older, other_model):
        [row] = targets.rows({"step-in-process.json": headline, targets.RESOLVING_RUN: resolving})
        assert row.verdict == targets.MISSED
        assert row.source == "`step-in-process.json`, 2026-11-28"


def test_bench_all_launches_on_the_adapter_cases_it_left_short_of_met() -> None:
    met = _step_case(
        "zero2/deepspeed",
        "deepspeed",
        None,
        combined_ratio_to_baseline={"toolkit": _spread(0.98, 0.97, 0.99)},
    )
    short = _adapter_run("2026-11-28T06:00:00+00:00", 1.008)
    short["cases"][0]["combined_ratio_to_baseline"]["toolkit"]["ci_high"] = 1.02
    argv = runs.resolve_run("spec.yaml", "out", runs.FULL, {"cases": [met, *short["cases"]]})
    assert argv is not None
    assert argv[argv.index("--cases") + 1 : argv.index("--name")] == ["zero0/deepspeed"]
    assert f"{argv[argv.index('--name') + 1]}.json" == targets.RESOLVING_RUN
    assert "--resolve" in argv and "--in-process" in argv
    assert runs.resolve_run("spec.yaml", "out", runs.FULL, {"cases": [met]}) is None


def _allreduce_run(date: str, ranks: int, **medians: float) -> dict[str, Any]:
    """An allreduce.json with these toolkit paths' ratios at the target's size (±0.01)."""
    size = str(targets.ALLREDUCE_SIZE)
    spreads = {
        label: {size: allreduce_spread(median, median - 0.01, median + 0.01)}
        for label, median in medians.items()
    }
    return {
        "machine": {**MACHINE, "date": date},
        "ranks": ranks,
        "toolkit_over_raw_busbw": {},
        "toolkit_over_raw_spread": spreads,
    }


DDP_IN_PLACE, TF_RING = "toolkit ddp (gloo), in place", "toolkit tf (ring)"


def test_a_newer_allreduce_resolving_run_replaces_the_rows_it_measured() -> None:
    headline = _allreduce_run("2026-11-28T06:00:00+00:00", 2, **{DDP_IN_PLACE: 0.97, TF_RING: 0.99})
    newer = _allreduce_run("2026-11-29T06:00:00+00:00", 2, **{DDP_IN_PLACE: 1.01})
    runs_read = {"allreduce.json": headline, targets.ALLREDUCE_RESOLVING_RUN: newer}
    rows = {row.subject: row for row in targets.rows(runs_read)}
    assert rows[DDP_IN_PLACE].verdict == targets.MET
    assert rows[DDP_IN_PLACE].source == f"`{targets.ALLREDUCE_RESOLVING_RUN}`, 2026-11-29"
    # What the resolving run did not launch keeps its row from the size sweep.
    assert rows[TF_RING].source == "`allreduce.json`, 2026-11-28"
    assert rows["toolkit horovod (MPI), in place"].verdict == targets.NOT_RUN
    assert targets.ALLREDUCE_RESOLVING_RUN in "".join(targets.section(runs_read))
    older = _allreduce_run("2026-11-27T06:00:00+00:00", 2, **{DDP_IN_PLACE: 1.01})
    more_ranks = _allreduce_run("2026-11-29T06:00:00+00:00", 4, **{DDP_IN_PLACE: 1.01})
    for resolving in (older, more_ranks):
        runs_read = {"allreduce.json": headline, targets.ALLREDUCE_RESOLVING_RUN: resolving}
        rows = {row.subject: row for row in targets.rows(runs_read)}
        assert rows[DDP_IN_PLACE].verdict == targets.MISSED
        assert targets.ALLREDUCE_RESOLVING_RUN not in "".join(targets.section(runs_read))


def test_bench_all_launches_on_the_allreduce_sweeps_it_left_short_of_met() -> None:
    headline = _allreduce_run(
        "2026-11-28T06:00:00+00:00", 2, **{DDP_IN_PLACE: 1.05, TF_RING: 0.985}
    )
    argv = runs.resolve_allreduce_run("out", runs.FULL, headline)
    assert argv is not None
    # TF's interval reaches below 0.98, and the Horovod sweeps were not measured: all three.
    sweeps = argv[argv.index("--sweeps") + 1 : argv.index("--name")]
    assert sweeps == ["horovod-mpi/horovodrun", "horovod-gloo/horovodrun", "tf/local"]
    assert f"{argv[argv.index('--name') + 1]}.json" == targets.ALLREDUCE_RESOLVING_RUN
    assert argv[argv.index("--sizes") + 1] == str(64 * MIB)
    met = {label: 1.05 for label in (DDP_IN_PLACE, TF_RING)}
    met["toolkit horovod (MPI), in place"] = met["toolkit horovod (Gloo), in place"] = 1.05
    assert (
        runs.resolve_allreduce_run("out", runs.FULL, _allreduce_run(MACHINE["date"], 2, **met))
        is None
    )


def _floor_run(date: str, **medians: float) -> dict[str, Any]:
    """A step-floor.json of these Horovod cases (torch over MPI, TF over MPI) at these ratios."""
    frameworks = {"horovod-torch-mpi/horovodrun": None, "horovod-tf-mpi/horovodrun": "tensorflow"}
    cases = [
        _step_case(
            case,
            "horovod",
            frameworks[case],
            toolkit_over_floor=_spread(median, median - 0.05, median + 0.05),
        )
        for case, median in medians.items()
    ]
    return {
        "machine": {**MACHINE, "date": date},
        "workloads": {case: {"layers": "512,2048"} for case in medians},
        "cases": cases,
    }


TORCH_MPI, TF_MPI = "horovod-torch-mpi/horovodrun", "horovod-tf-mpi/horovodrun"


def test_bench_all_launches_again_on_the_floor_rows_it_left_short_and_reads_them() -> None:
    headline = _floor_run("2026-11-28T06:00:00+00:00", **{TORCH_MPI: 1.1, TF_MPI: 1.23})
    argv = runs.resolve_floor_run("spec.yaml", "out", runs.FULL, headline)
    assert argv is not None and "--floor" in argv
    assert argv[argv.index("--cases") + 1 : argv.index("--name")] == [TF_MPI]
    assert f"{argv[argv.index('--name') + 1]}.json" == targets.FLOOR_RESOLVING_RUN
    assert (
        runs.resolve_floor_run("spec.yaml", "out", runs.FULL, _floor_run(MACHINE["date"])) is None
    )
    resolving = _floor_run("2026-11-29T06:00:00+00:00", **{TF_MPI: 1.15})
    rows = targets.rows({"step-floor.json": headline, targets.FLOOR_RESOLVING_RUN: resolving})
    verdicts = {row.subject: (row.verdict, row.source) for row in rows}
    assert verdicts == {
        TORCH_MPI: (targets.MET, "`step-floor.json`, 2026-11-28"),
        TF_MPI: (targets.MET, f"`{targets.FLOOR_RESOLVING_RUN}`, 2026-11-29"),
    }


def _short_headlines() -> dict[str, dict[str, Any]]:
    """A headline file for each resolving run, each leaving its targets short of met."""
    return {
        "step-in-process.json": _adapter_run(MACHINE["date"], 1.03),
        "step-floor.json": _floor_run(MACHINE["date"], **{TF_MPI: 1.3}),
        "allreduce.json": _allreduce_run(MACHINE["date"], 2, **{DDP_IN_PLACE: 0.9}),
    }


def test_bench_all_launches_again_into_each_resolving_run_the_targets_read() -> None:
    resolving = {run.headline: run.name for run in targets.RESOLVING_RUNS}
    launches_again = runs.resolvers("spec.yaml", "out")
    assert sorted(launches_again) == sorted(resolving)
    for headline, data in _short_headlines().items():
        argv = launches_again[headline](data)
        assert argv is not None
        assert f"{argv[argv.index('--name') + 1]}.json" == resolving[headline]


def test_a_smoke_run_measures_tiny_workloads_away_from_the_recorded_figures() -> None:
    smoke = runs.SMOKE
    assert Path(smoke.dir).resolve() != Path(runs.FULL.dir).resolve()
    assert Path(smoke.to).parent == Path(smoke.dir)
    commands = runs.all_runs("spec.yaml", smoke.reps, smoke.dir, smoke)
    assert sorted(commands) == sorted(runs.all_runs("spec.yaml", 3, "out"))
    launches_again = runs.resolvers("spec.yaml", smoke.dir, smoke)
    again = [launches_again[name](data) for name, data in _short_headlines().items()]
    for argv in [*commands.values(), *again]:
        assert argv is not None
        assert argv[argv.index("--out") + 1] == smoke.dir
        if argv[1] == "step":  # the launches-again too, or the targets would not compare them
            assert argv[argv.index("--layers") + 1] == "16,8,4"
    # Of the allreduce sweeps left short, the smoke launches again only on its own.
    [*_, allreduce_again] = again
    assert allreduce_again[allreduce_again.index("--sweeps") + 1 :][:2] == ["ddp/mpirun", "--name"]
