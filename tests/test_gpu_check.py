"""The GPU check: scripts/gpu_check.sh, scripts/gpu_wheels.sh and hvd_examples/gpu_check.py
(docs/gpu/README.md).

- Unit: the wheel budget (the working tree and the wheels within the device tool's 64 MiB), the
  working tree as that tool counts it, the wheels' requirements against each other and the GPU
  machine's packages, the loss comparison and the report's figures, and the check's specs
  agreeing on everything but the engine.
- Without a GPU: the GPU run refuses in one line with exit status 2, and so does a dry run
  without a wheelhouse.
- multiproc: the check at its tiny size on the CPU, through the plain loop and the engines (DDP
  and ZeRO-3 by default, FSDP and every ZeRO stage too with TOOLKIT_GPT=full), the processes
  the dry run starts;
  with TOOLKIT_GPT=full and a wheelhouse built, the whole dry run.
- gpu (skipped without a GPU; gpu_check.sh runs them on the lent GPU machine): the tiny check on
  the GPU, every engine on CUDA within the tolerance, its peak memory measured.
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import zipfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.options import FULL_GPT
from tests.realrun import PYTHON, ROOT
from toolkit.plan.model_facts import ModelFacts
from toolkit.plan.table import plan_rows
from toolkit.spec import load_spec
from toolkit.units import MIB

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
CHECK = ROOT / "hvd_examples" / "gpu_check.py"
WHEELHOUSE = ROOT / ".whl"
SHARED = ("seed", "device", "precision", "batch", "optimizer", "schedule", "clip_grad_norm")


@cache
def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


needs_gpu = pytest.mark.skipif("not cuda_available()", reason="no GPU visible")


@pytest.fixture(scope="module")
def gpu_check() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "hvd_examples"))
        yield importlib.import_module("gpu_check")


def bash(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def fake_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A wheel holding only its METADATA."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {text}" for text in requires]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(lines) + "\n")
    return path


# -- the wheelhouse ----------------------------------------------------------------------------
def test_the_budget_is_the_limit_less_the_tree_and_the_wheels(gpu_check: ModuleType) -> None:
    budget = gpu_check.Budget(tree_bytes=4 * MIB, wheel_bytes=6 * MIB)
    assert budget.limit_bytes == 64 * MIB and budget.left_bytes == 54 * MIB and budget.fits
    exactly = gpu_check.Budget(tree_bytes=60 * MIB, wheel_bytes=4 * MIB)
    assert exactly.fits and exactly.left_bytes == 0
    over = gpu_check.Budget(tree_bytes=60 * MIB, wheel_bytes=4 * MIB + 1)
    assert not over.fits and over.left_bytes == -1
    assert budget.line() == (
        "working tree 4.0 MiB + wheels 6.0 MiB = 10.0 MiB of 64 MiB (54.0 MiB left)"
    )


def test_the_tree_counts_what_the_device_tool_sends(gpu_check: ModuleType, tmp_path: Path) -> None:
    """Tracked and untracked files count, ignored ones (the wheelhouse, a venv) do not."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/.whl/\n")
    (tmp_path / "tracked.py").write_bytes(b"x" * 1000)
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.py"], check=True)
    (tmp_path / "untracked.txt").write_bytes(b"y" * 300)
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "big.whl").write_bytes(b"z" * 10_000)
    assert gpu_check.tree_bytes(tmp_path) == 1000 + 300 + len("/.whl/\n")


def test_a_wheel_is_read_from_its_metadata(gpu_check: ModuleType, tmp_path: Path) -> None:
    path = fake_wheel(tmp_path, "Typing_Inspection", "0.4.5", ("typing-extensions>=4.15.0",))
    wheel = gpu_check.read_wheel(path)
    assert (wheel.name, wheel.version) == ("typing-inspection", "0.4.5")
    assert wheel.requires == ("typing-extensions>=4.15.0",) and wheel.size == path.stat().st_size


def test_requirements_are_met_by_a_wheel_or_the_machine(gpu_check: ModuleType) -> None:
    wheel = gpu_check.Wheel
    wheels = [
        wheel("pydantic", "2.14.4", 1, ("pydantic-core==2.50.5", "annotated-types>=0.6.0")),
        wheel("pydantic-core", "2.50.5", 1, ("typing-extensions>=4.16.0",)),
        wheel("deepspeed", "0.19.8", 1, ("torch>=2.0.0", "msgpack", 'wandb; extra == "dev"')),
        wheel("pyyaml", "6.0.4", 1, ('pywin32; sys_platform == "win32"',)),
    ]
    present = {"torch": "2.11.0", "msgpack": None, "annotated-types": "0.8.0"}
    assert gpu_check.unmet(wheels, present, ["pyyaml>=6"]) == [
        "pydantic-core needs typing-extensions>=4.16.0: on neither"
    ]
    old_torch = {**present, "typing-extensions": "4.16.0", "torch": "1.13.0"}
    assert gpu_check.unmet(wheels, old_torch, ["pydantic>=3"]) == [
        "deepspeed needs torch>=2.0.0: 1.13.0 there",
        "the toolkit needs pydantic>=3: 2.14.4 there",
    ]


def test_two_wheels_of_one_package_are_refused(gpu_check: ModuleType) -> None:
    wheels = [gpu_check.Wheel("hjson", "3.1.0", 1, ()), gpu_check.Wheel("hjson", "3.0.2", 1, ())]
    assert gpu_check.unmet(wheels, {}) == ["hjson: two wheels (3.1.0, 3.0.2)"]


def test_the_wheel_check_exits_1_over_the_budget_or_with_needs_unmet(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The toolkit's own dependencies that the machine lacks (pydantic, PyYAML) must travel."""
    fake_wheel(tmp_path, "pydantic", "2.14.4")
    assert gpu_check.check_wheels(tmp_path) == 1
    assert "unmet: the toolkit needs pyyaml>=6: on neither" in capsys.readouterr().err
    fake_wheel(tmp_path, "pyyaml", "6.0.4")
    assert gpu_check.check_wheels(tmp_path) == 0
    assert "  pyyaml 6.0.4: 0.00 MiB" in capsys.readouterr().out
    assert gpu_check.check_wheels(tmp_path, limit=MIB) == 1
    assert "over the budget by" in capsys.readouterr().err


@pytest.mark.skipif(not WHEELHOUSE.is_dir(), reason="no wheelhouse: bash scripts/gpu_wheels.sh")
def test_the_built_wheelhouse_fits_and_meets_its_needs(gpu_check: ModuleType) -> None:
    assert gpu_check.check_wheels(WHEELHOUSE) == 0


# -- the report's figures ----------------------------------------------------------------------
def test_the_deviation_is_the_worst_step_and_infinite_when_a_run_diverges(
    gpu_check: ModuleType,
) -> None:
    assert gpu_check.deviation([5.5, 4.0], [5.0, 4.0]) == pytest.approx(0.1)
    assert gpu_check.deviation([5.0, math.nan], [5.0, 4.0]) == math.inf
    assert gpu_check.deviation([5.0], [5.0, 4.0]) == math.inf


def test_mfu_is_6_n_tokens_over_time_over_the_named_gpus_peak(gpu_check: ModuleType) -> None:
    size = gpu_check.SIZES["gpt2-small"]
    result = {
        "step_seconds": [9.0] * size.warmup + [0.5, 0.5, 0.25],  # warm-up steps are not timed
        "tokens_per_step": 16 * 1024,
        "device_name": "NVIDIA H200",
    }
    figures = gpu_check.timing(result, size, parameters=86_039_040)
    tokens_per_s = 3 * 16 * 1024 / 1.25
    assert figures["tokens_per_s"] == round(tokens_per_s) and figures["step_ms_median"] == 500
    assert figures["mfu"] == round(6 * 86_039_040 * tokens_per_s / 989e12, 6)
    attention = 12 * 12 * 768 * 1024 * tokens_per_s / 989e12
    assert figures["mfu_with_attention"] == pytest.approx(figures["mfu"] + attention, abs=2e-6)
    assert gpu_check.timing({**result, "device_name": None}, size, 1)["mfu"] is None


def test_the_plan_row_is_the_runs_engine_and_zero_stage(gpu_check: ModuleType) -> None:
    facts = ModelFacts(parameters=86_039_040, largest_layer=2_362_368)
    rows = [("gpu_ddp", "ddp+torch"), ("gpu_fsdp", "fsdp+torch"), ("gpu_zero3", "deepspeed zero-3")]
    for name, row in rows:
        spec = load_spec(ROOT / "hvd_examples" / "specs" / f"{name}.yaml")
        expected = next(r for r in plan_rows(spec, facts, 1) if r.name == row).memory.total
        assert gpu_check.planned_bytes(spec, facts) == expected


def result_of(losses: list[float], **fields: Any) -> dict[str, Any]:
    """A run's result as gpu_check_run.py writes it."""
    return {
        "device": "cuda:0",
        "device_name": "NVIDIA H200",
        "losses": losses,
        "step_seconds": [0.2] * len(losses),
        "tokens_per_step": 4 * 64,
        "eval_loss": losses[-1],
        "peak_memory_bytes": 3 * MIB,
        "state_dict_entries": 29,
        "expected_state_dict_entries": 29,
        "state_dict_on_host": True,
        **fields,
    }


def test_an_engine_passes_within_the_tolerance_on_the_plain_loops_device(
    gpu_check: ModuleType, tmp_path: Path
) -> None:
    size = gpu_check.SIZES["tiny"]
    facts = {"parameters": 120_576, "largest_layer": 12_480, "layer_parameters": [16_384, 12_480]}
    plain = {**result_of([5.0, 4.0, 3.0, 2.0]), "parameters": 120_576, "facts": facts}
    results = {
        "plain": plain,
        "ddp": result_of([5.0, 4.0, 3.0, 2.0]),
        "zero1": result_of([5.0, 4.0, 3.0, 2.0 * 1.03]),  # 3% off at the last step
        "zero2": result_of([5.0, 4.0, 3.0, 2.0], device="cpu"),  # trained on the CPU
        "zero3": {"error": "exit status 1", "output_tail": ["Traceback"], "wall_seconds": 3.0},
    }  # fsdp not run (--runs)
    specs = {run.name: gpu_check.run_spec(run, size, tmp_path)[1] for run in gpu_check.RUNS}
    report = gpu_check.build_report("tiny", results, specs, seconds=12.0)
    runs = report["runs"]
    assert [name for name, run in runs.items() if run["ok"]] == ["plain", "ddp"]
    assert not report["passed"]
    assert runs["zero1"]["checks"] == {
        "losses_within_tolerance": False,
        "on_the_plain_loop_device": True,
        "full_state_dict_on_host": True,
    }
    assert runs["zero1"]["loss_deviation"] == pytest.approx(0.03)
    assert not runs["zero2"]["checks"]["on_the_plain_loop_device"]
    assert runs["ddp"]["step_ratio"] == 1.0 and runs["ddp"]["peak_over_plan"] > 0
    page = gpu_check.summary(report)
    assert page.startswith("# GPU check: FAILED")
    assert "| zero1 | NVIDIA H200 |" in page and "no: losses_within_tolerance |" in page
    assert "| zero3 | exit status 1 |" in page and "NCCL between ranks" in page


def test_a_failed_plain_loop_fails_every_run(gpu_check: ModuleType, tmp_path: Path) -> None:
    size = gpu_check.SIZES["tiny"]
    results = {"plain": {"error": "exit status 1"}, "ddp": result_of([5.0])}
    specs = {run.name: gpu_check.run_spec(run, size, tmp_path)[1] for run in gpu_check.RUNS}
    report = gpu_check.build_report("tiny", results, specs, seconds=1.0)
    assert not report["passed"] and not report["runs"]["ddp"]["ok"]


def test_unknown_runs_are_refused_in_one_line(gpu_check: ModuleType) -> None:
    from toolkit.errors import ToolkitError

    with pytest.raises(ToolkitError, match="--runs zero9: no such run"):
        gpu_check.selected(["ddp", "zero9"])
    assert [run.name for run in gpu_check.selected(["zero3"])] == ["plain", "zero3"]


def test_the_check_specs_differ_only_in_the_engine(gpu_check: ModuleType) -> None:
    specs = {run.spec for run in gpu_check.RUNS}
    data = {
        name: yaml.safe_load((ROOT / "hvd_examples" / "specs" / name).read_text()) for name in specs
    }
    reference = data["gpu_ddp.yaml"]
    for name, spec in data.items():
        assert {key: spec[key] for key in SHARED} == {key: reference[key] for key in SHARED}, name
        parsed = load_spec(ROOT / "hvd_examples" / "specs" / name)
        assert parsed.device == "cuda" and parsed.precision == "bf16"
        assert parsed.batch_for(1).accumulation == 2  # the engines' own accumulation runs
    backends = sorted(
        (spec["backend"], spec.get("zero", {}).get("stage", 0)) for spec in data.values()
    )
    assert backends == [
        ("ddp", 0),
        ("deepspeed", 1),
        ("deepspeed", 2),
        ("deepspeed", 3),
        ("fsdp", 0),
    ]


# -- the script, without a GPU -----------------------------------------------------------------
@pytest.mark.skipif("cuda_available()", reason="a GPU is visible: the script would run")
@pytest.mark.parametrize("args", [["out"], []])
def test_without_a_gpu_the_script_refuses_in_one_line(args: list[str], tmp_path: Path) -> None:
    done = bash(*[str(tmp_path / a) for a in args])
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: "), done.stderr
    assert ("no GPU visible" if args else "usage:") in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_dry_run_without_a_wheelhouse_refuses_in_one_line(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "TOOLKIT_GPU_WHEELS": str(tmp_path / "none")}
    done = bash("--dry-run", str(tmp_path / "out"), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"gpu_check: no wheelhouse at {tmp_path / 'none'}: run bash scripts/gpu_wheels.sh"
    ]


# -- the tiny check through the engines: CPU here, GPU there -----------------------------------
def run_tiny_check(out: Path, runs: list[str]) -> dict[str, Any]:
    argv = [PYTHON, str(CHECK), "check", str(out), "--size", "tiny", "--runs", ",".join(runs)]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=480, check=False, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report: dict[str, Any] = json.loads((out / "gpu_check.json").read_text())
    assert (out / "gpu_check.md").read_text().startswith("# GPU check: passed")
    assert list(report["runs"]) == ["plain", *runs] and report["passed"]
    return report


ALL_RUNS = ["ddp", "fsdp", "zero1", "zero2", "zero3"]
TINY_RUNS = ALL_RUNS if FULL_GPT else ["ddp", "zero3"]


@pytest.mark.multiproc
@pytest.mark.usefixtures("no_orphans")
@pytest.mark.skipif("cuda_available()", reason="a GPU is visible: test_the_tiny_check_on_the_gpu")
def test_the_tiny_check_runs_every_engine_on_the_cpu(tmp_path: Path) -> None:
    report = run_tiny_check(tmp_path, TINY_RUNS)
    for name, run in report["runs"].items():
        assert run["device"] == "cpu" and run["peak_memory_bytes"] is None, name
        assert len(run["losses"]) == report["steps"] == 4 and run["timed_steps"] == 3, name
    for name in TINY_RUNS:
        run = report["runs"][name]
        assert run["environment"] == "single" and run["plan_bytes"] > 0, name
        assert run["loss_deviation"] <= report["tolerance"]["rtol"], name


@pytest.mark.gpu
@needs_gpu
@pytest.mark.usefixtures("no_orphans")
def test_the_tiny_check_on_the_gpu(tmp_path: Path) -> None:
    report = run_tiny_check(tmp_path, ALL_RUNS)
    for name, run in report["runs"].items():
        assert run["device"] == "cuda:0" and run["peak_memory_bytes"] > 0, name
        assert 0 < run["mfu"] < 1 and run["tokens_per_s"] > 0, name
    assert all(run["ok"] for run in report["runs"].values())


@pytest.mark.multiproc
@pytest.mark.usefixtures("no_orphans")
@pytest.mark.skipif(not FULL_GPT, reason="the whole dry run, a minute or two: TOOLKIT_GPT=full")
@pytest.mark.skipif(not WHEELHOUSE.is_dir(), reason="no wheelhouse: bash scripts/gpu_wheels.sh")
def test_the_dry_run_installs_the_wheels_for_python_3_12_and_runs_the_check(
    tmp_path: Path,
) -> None:
    done = bash("--dry-run", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "installed: " in done.stdout and "deepspeed-0.19.8" in done.stdout
    assert "dry run: " in done.stdout and "has 480 s for the install" in done.stdout
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["passed"]
