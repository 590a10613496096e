"""The GPU check (scripts/gpu_check.sh; docs/gpu/README.md): the GPT example at GPT-2 small's
shape on one GPU, under DDP, FSDP and DeepSpeed ZeRO-1, 2 and 3, held to a plain torch loop.

    python hvd_examples/gpu_check.py check OUT [--size tiny]  # every run; OUT/gpu_check.json, .md
    python hvd_examples/gpu_check.py wheels .whl               # the carried wheels: needs, budget

Each run (the plain loop first, then every engine of RUNS, or those --runs names) is a process
of its own (gpu_check_run.py), so that DeepSpeed's imports, the process group and the
peak-memory counter belong to that run alone. Each is one rank started by no launcher:
toolkit.init's "single" environment, which every torch engine accepts. The engine runs must
match the plain loop's per-step losses and held-out loss within RTOL. The report gives each
run's tokens/s, model FLOPs utilisation, peak GPU memory beside `toolkit plan`'s estimate for
its spec, and its median step time over the plain loop's. This process imports neither torch nor
an engine.

`wheels` measures what the device machine's working tree would carry: the wheelhouse and the
repository's files together must stay within LIMIT_BYTES, and every wheel's requirements must be
met by another wheel or by a package the GPU machine has (GPU_MACHINE_HAS).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from toolkit.engines import engine
from toolkit.errors import ToolkitError
from toolkit.plan.memory import ZeroLayout
from toolkit.plan.model_facts import ModelFacts
from toolkit.plan.table import Setting, layout_name, plan_rule
from toolkit.report import exit_on_user_error
from toolkit.spec import TrainSpec
from toolkit.units import MIB

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SPECS = HERE / "specs"
RUNNER = HERE / "gpu_check_run.py"

# -- what the check runs ----------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """The model's shape, the untimed warm-up steps, and what the size changes in each spec."""

    layers: int
    heads: int
    width: int
    block: int
    warmup: int
    changes: dict[str, Any] = field(default_factory=dict)


SIZES = {
    # GPT-2 small's shape (124M parameters with its 50257-token vocabulary); the example reads
    # bytes, so its vocabulary is 256 and the model has 86.0M. The specs are written for it.
    "gpt2-small": Size(layers=12, heads=12, width=768, block=1024, warmup=5),
    # Every code path of the check in seconds: the dry run on a CPU, the gpu-marked tests on a
    # GPU (device auto).
    "tiny": Size(
        layers=2,
        heads=2,
        width=64,
        block=64,
        warmup=1,
        changes={
            "device": "auto",
            "batch": {"global": 4, "micro": 2},
            "schedule": {"warmup_steps": 1, "total_steps": 4},
        },
    ),
}


@dataclass(frozen=True)
class Run:
    name: str
    spec: str
    plain: bool = False


REFERENCE = "plain"
# The plain loop reads DDP's spec: the same seed, batch, optimizer, schedule and precision.
RUNS = (
    Run(REFERENCE, "gpu_ddp.yaml", plain=True),
    Run("ddp", "gpu_ddp.yaml"),
    Run("fsdp", "gpu_fsdp.yaml"),
    Run("zero1", "gpu_zero1.yaml"),
    Run("zero2", "gpu_zero2.yaml"),
    Run("zero3", "gpu_zero3.yaml"),
)

RTOL = 0.02
RTOL_WHY = (
    "DeepSpeed's bf16 mode casts the whole model to bf16 (weights, activations, the residual "
    "stream, LayerNorm, gradients; fp32 master weights), and FSDP computes with bf16 copies of "
    "its fp32 shards, where the plain loop's autocast rounds only the matrix products' inputs. "
    "bf16 keeps 8 significant bits (a rounding of up to 2^-8 = 0.4% of a value), and the two "
    "paths' losses differ by a few such roundings: 2% is five. Measured on a CPU at 4 layers, "
    "128 wide, sequence 128, over these 40 steps: ZeRO-2 and 3 at most 3.2e-3, FSDP 7.7e-4, DDP "
    "(the plain loop's own autocast path) 6e-8."
)
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12}
PEAK_WHY = (
    "NVIDIA's dense bf16 Tensor Core peak for the H100/H200 SXM (989 TFLOP/s; 1979 is with "
    "sparsity); an 8192^3 bf16 matrix product measured about 790 TFLOP/s on the lent H200"
)
BUDGET_S = 300.0  # the runs, DeepSpeed's imports included: gpu_check.sh's 8 minutes hold the
# wheels' install and the gpu-marked tests besides
NOT_CHECKED = (
    "NCCL between ranks: one GPU holds one rank (NCCL refuses two ranks on one GPU), so DDP's "
    "gradient all-reduce, ZeRO's partitioning across ranks and every collective ran on one rank",
    "several GPUs per host and several hosts: the device binding of local ranks > 0, launch.np "
    "defaulting to the GPUs, the launchers' GPU counts",
    "Horovod on the GPU: no wheel built for the machine's PyTorch 2.11 (CUDA 13, Python 3.12) "
    "is carried (docs/gpu/README.md)",
    "TensorFlow on the GPU: the machine has no TensorFlow",
    "fp16 with loss scaling: the check trains bf16",
    "CPU offload, checkpoints written on the GPU and resumed on the CPU",
)


# -- the wheelhouse and its budget --------------------------------------------------------------

LIMIT_BYTES = 64 * MIB  # what one device call carries: the working tree and the wheels
# The lent GPU machine's packages that the carried wheels and the toolkit need, with the versions
# its pip list showed (None: present, version not read), from its package list of 2026-11-17.
GPU_MACHINE_HAS: dict[str, str | None] = {
    "torch": "2.11.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "transformers": "5.17.0",
    "packaging": None,
    "psutil": None,
    "tqdm": None,
    "einops": None,
    "msgpack": None,
    "ninja": None,
    "py-cpuinfo": None,
    "nvidia-ml-py": None,
}
TARGET_MARKERS = {"python_version": "3.12", "sys_platform": "linux", "platform_system": "Linux"}


@dataclass(frozen=True)
class Budget:
    tree_bytes: int
    wheel_bytes: int
    limit_bytes: int = LIMIT_BYTES

    @property
    def left_bytes(self) -> int:
        return self.limit_bytes - self.tree_bytes - self.wheel_bytes

    @property
    def fits(self) -> bool:
        return self.left_bytes >= 0

    def line(self) -> str:
        return (
            f"working tree {self.tree_bytes / MIB:.1f} MiB + wheels {self.wheel_bytes / MIB:.1f} "
            f"MiB = {(self.tree_bytes + self.wheel_bytes) / MIB:.1f} MiB of "
            f"{self.limit_bytes / MIB:.0f} MiB ({self.left_bytes / MIB:.1f} MiB left)"
        )


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    size: int
    requires: tuple[str, ...]


def tree_bytes(root: Path) -> int:
    """Bytes of what the device tool sends: the tracked files and the untracked ones that git
    does not ignore (a link counts as the link)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    paths = (root / name for name in listed.split("\0") if name)
    return sum(path.lstat().st_size for path in paths if path.is_symlink() or path.is_file())


def read_wheel(path: Path) -> Wheel:
    """A wheel's name, version, size and Requires-Dist, from its METADATA."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = HeaderParser().parsestr(archive.read(name).decode())
    return Wheel(
        name=canonicalize_name(metadata["Name"]),
        version=metadata["Version"],
        size=path.stat().st_size,
        requires=tuple(metadata.get_all("Requires-Dist") or ()),
    )


def unmet(
    wheels: Sequence[Wheel], present: Mapping[str, str | None], required: Sequence[str] = ()
) -> list[str]:
    """Requirements (each wheel's, outside its extras, and `required`) that neither a wheel nor
    a `present` package meets on the GPU machine; a present package of unknown version meets any
    range. Two wheels of one package are an error of their own: pip refuses to install both."""
    found: list[str] = []
    carried: dict[str, str] = {}
    for wheel in wheels:
        if wheel.name in carried:
            found.append(f"{wheel.name}: two wheels ({carried[wheel.name]}, {wheel.version})")
        carried[wheel.name] = wheel.version
    needs = [(w.name, text) for w in wheels for text in w.requires]
    needs += [("the toolkit", text) for text in required]
    for owner, text in needs:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate({**TARGET_MARKERS, "extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        version = carried.get(name, present.get(name))
        known = name in carried or name in present
        if not known or (version is not None and version not in requirement.specifier):
            have = f"{version} there" if known else "on neither"
            found.append(f"{owner} needs {text}: {have}")
    return found


def toolkit_requirements(root: Path) -> list[str]:
    """pyproject.toml's core dependencies: what `import toolkit` needs."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def check_wheels(folder: Path, root: Path = ROOT, limit: int = LIMIT_BYTES) -> int:
    """Print each wheel and the budget; 1 when a requirement is unmet or the budget exceeded."""
    paths = sorted(folder.glob("*.whl"))
    if not paths:
        raise ToolkitError(
            f"{folder}: no wheels", "build the wheelhouse with bash scripts/gpu_wheels.sh"
        )
    wheels = [read_wheel(path) for path in paths]
    for wheel in wheels:
        print(f"  {wheel.name} {wheel.version}: {wheel.size / MIB:.2f} MiB")
    budget = Budget(tree_bytes(root), sum(w.size for w in wheels), limit)
    print(f"budget: {budget.line()}")
    problems = unmet(wheels, GPU_MACHINE_HAS, toolkit_requirements(root))
    for problem in problems:
        print(f"unmet: {problem}", file=sys.stderr)
    if not budget.fits:
        print(f"over the budget by {-budget.left_bytes / MIB:.1f} MiB", file=sys.stderr)
    return 0 if budget.fits and not problems else 1


# -- running the check --------------------------------------------------------------------------


def merged(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with each section of `changes` merged into it and each other field replaced."""
    result = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(dict(result[key]), value)
        else:
            result[key] = value
    return result


def run_spec(run: Run, size: Size, directory: Path) -> tuple[Path, TrainSpec]:
    """The run's spec with the size's changes, written into `directory` and validated."""
    data = merged(yaml.safe_load((SPECS / run.spec).read_text()), size.changes)
    spec = TrainSpec.from_dict(data)
    path = directory / f"{run.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, spec


def start_run(run: Run, size: str, spec: Path, result: Path, timeout: float) -> dict[str, Any]:
    """One run in its own process: its result, or its exit status and the end of its output."""
    argv = [sys.executable, str(RUNNER), "--spec", str(spec), "--size", size]
    argv += ["--result", str(result), *(["--plain"] if run.plain else [])]
    log = result.with_suffix(".log")
    started = time.monotonic()
    with log.open("w") as output:
        try:
            # Unbuffered: a run stopped at its timeout leaves what it printed in its log.
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            done = subprocess.run(
                argv, stdout=output, stderr=subprocess.STDOUT, timeout=timeout, env=env
            )
            status: int | str = done.returncode
        except subprocess.TimeoutExpired:
            status = f"stopped after {timeout:.0f} s"
    seconds = round(time.monotonic() - started, 1)
    if status == 0 and result.exists():
        return {**json.loads(result.read_text()), "wall_seconds": seconds}
    tail = log.read_text(errors="replace").splitlines()[-30:]
    return {"error": f"exit status {status}", "output_tail": tail, "wall_seconds": seconds}


def planned_bytes(spec: TrainSpec, facts: ModelFacts) -> float:
    """`toolkit plan`'s bytes on the device for this spec's engine, ZeRO stage and offload, one
    rank."""
    rows = plan_rule(engine(spec.backend, spec.framework_name))(Setting(spec, facts, 1))
    name = plan_row_name(spec)
    return next(row for row in rows if name in (None, row.name)).memory.total


def plan_row_name(spec: TrainSpec) -> str | None:
    """The plan's row for an engine of several rows (a ZeRO layout, FSDP's offload or not)."""
    if spec.backend == "deepspeed":
        zero = spec.zero
        layout = ZeroLayout(
            stage=zero.stage,
            offload_optimizer=zero.offload_optimizer != "none",
            offload_params=zero.offload_params != "none",
        )
        return layout_name(layout)
    if spec.backend == "fsdp":
        return "fsdp+torch" + (
            "" if spec.fsdp.offload == "none" else f" offload {spec.fsdp.offload}"
        )
    return None


def deviation(values: Sequence[float], reference: Sequence[float]) -> float:
    """The largest |value - reference| / |reference| over the steps (inf when the counts
    differ or a value is not finite)."""
    if len(values) != len(reference) or not all(map(math.isfinite, values)):
        return math.inf
    return max(abs(v - r) / abs(r) for v, r in zip(values, reference, strict=True))


def flops_per_token(parameters: int, size: Size) -> tuple[float, float]:
    """Training FLOPs per token: 6 N, and 6 N plus the attention scores' 12 L d s (PaLM's
    appendix B), whose products the parameter count does not see."""
    dense = 6.0 * parameters
    return dense, dense + 12.0 * size.layers * size.width * size.block


def peak_flops(device_name: str | None) -> float | None:
    """The dense bf16 peak of the named GPU (PEAK_BF16_FLOPS), None for a CPU or another GPU."""
    return next((v for k, v in PEAK_BF16_FLOPS.items() if device_name and k in device_name), None)


def timing(result: dict[str, Any], size: Size, parameters: int) -> dict[str, Any]:
    """Tokens/s over the timed steps, the median step, and the model FLOPs utilisation."""
    timed = result["step_seconds"][size.warmup :]
    tokens_per_s = result["tokens_per_step"] * len(timed) / sum(timed)
    peak = peak_flops(result.get("device_name"))
    dense, with_attention = flops_per_token(parameters, size)
    return {
        "timed_steps": len(timed),
        "tokens_per_s": round(tokens_per_s),
        "step_ms_median": round(1000 * statistics.median(timed), 2),
        "mfu": None if peak is None else round(dense * tokens_per_s / peak, 6),
        "mfu_with_attention": None
        if peak is None
        else round(with_attention * tokens_per_s / peak, 6),
    }


def against_reference(
    result: dict[str, Any], reference: dict[str, Any], step_ratio: float, planned: float
) -> dict[str, Any]:
    """An engine run beside the plain loop: its loss deviations, the step time ratio, its peak
    memory beside the plan's estimate, and the checks it passes: losses within RTOL, training on
    the plain loop's device, full_state_dict whole and in host memory."""
    losses = deviation(result["losses"], reference["losses"])
    held_out = deviation([result["eval_loss"]], [reference["eval_loss"]])
    peak = result.get("peak_memory_bytes")
    checks = {
        "losses_within_tolerance": max(losses, held_out) <= RTOL,
        "on_the_plain_loop_device": device_type(result) == device_type(reference),
        "full_state_dict_on_host": result["state_dict_on_host"]
        and result["state_dict_entries"] == result["expected_state_dict_entries"],
    }
    return {
        "loss_deviation": losses,
        "eval_loss_deviation": held_out,
        "step_ratio": round(step_ratio, 3),
        "plan_bytes": planned,
        "peak_over_plan": round(peak / planned, 3) if peak else None,
        "checks": checks,
        "ok": all(checks.values()),
    }


def device_type(result: dict[str, Any]) -> str:
    """ "cuda" of "cuda:0"."""
    return str(result["device"]).partition(":")[0]


def facts_of(data: dict[str, Any]) -> ModelFacts:
    """The plan's ModelFacts from the plain run's JSON (its lists are the facts' tuples)."""
    return ModelFacts(
        parameters=data["parameters"],
        largest_layer=data["largest_layer"],
        layer_parameters=tuple(data.get("layer_parameters", ())),
        layer_activations=tuple(data.get("layer_activations", ())),
        input_elements=data.get("input_elements", 0),
        source=data.get("source", ""),
    )


def assessed(
    results: Mapping[str, dict[str, Any]], specs: Mapping[str, TrainSpec], size: Size
) -> dict[str, dict[str, Any]]:
    """Every run's result with its figures; a run that failed, or whose reference failed, is
    not ok."""
    reference = results[REFERENCE]
    if "error" in reference:
        return {name: {**found, "ok": False} for name, found in results.items()}
    parameters = reference["parameters"]
    facts = facts_of(reference["facts"])
    plain = timing(reference, size, parameters)
    runs: dict[str, dict[str, Any]] = {REFERENCE: {**reference, **plain, "ok": True}}
    for name, found in results.items():
        if name == REFERENCE:
            continue
        if "error" in found:
            runs[name] = {**found, "ok": False}
            continue
        figures = timing(found, size, parameters)
        ratio = figures["step_ms_median"] / plain["step_ms_median"]
        planned = planned_bytes(specs[name], facts)
        runs[name] = {**found, **figures, **against_reference(found, reference, ratio, planned)}
    return runs


def build_report(
    size_name: str,
    results: Mapping[str, dict[str, Any]],
    specs: Mapping[str, TrainSpec],
    seconds: float,
) -> dict[str, Any]:
    """The JSON report: the setting, each run's result and figures, what was not checked."""
    size = SIZES[size_name]
    runs = assessed(results, specs, size)
    spec = specs[REFERENCE]
    batch = spec.batch_for(1)
    return {
        "check": "gpu_check",
        "passed": all(run["ok"] for run in runs.values()),
        "size": size_name,
        "model": {
            **asdict(size),
            "vocabulary": 256,
            "parameters": results[REFERENCE].get("parameters"),
        },
        "precision": spec.precision,
        "batch": {
            "global": batch.global_,
            "micro": batch.micro,
            "accumulation": batch.accumulation,
        },
        "steps": spec.schedule.total_steps,
        "world_size": 1,
        "tolerance": {"rtol": RTOL, "why": RTOL_WHY},
        "peak_bf16_flops": {"per_gpu": PEAK_BF16_FLOPS, "why": PEAK_WHY},
        "seconds": round(seconds, 1),
        "budget_seconds": BUDGET_S,
        "runs": runs,
        "not_checked": list(NOT_CHECKED),
    }


def summary(report: dict[str, Any]) -> str:
    """The report as a short markdown page."""
    model, batch = report["model"], report["batch"]
    lines = [
        f"# GPU check: {'passed' if report['passed'] else 'FAILED'}",
        "",
        f"GPT-2 at size {report['size']} ({model['layers']} layers, {model['heads']} heads, "
        f"{model['width']} wide, sequence {model['block']}, vocabulary {model['vocabulary']}: "
        f"{model['parameters']:,} parameters), {report['precision']}, batch {batch['global']} "
        f"(micro {batch['micro']} x {batch['accumulation']}), {report['steps']} steps of which "
        f"{model['warmup']} untimed, one rank; {report['seconds']} s of "
        f"{report['budget_seconds']:.0f}. Each engine's losses within rtol "
        f"{report['tolerance']['rtol']} of the plain loop's.",
        "",
        "| run | device | tokens/s | step ms | MFU | peak MiB | plan MiB | step / plain "
        "| loss dev. | ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [summary_row(name, run) for name, run in report["runs"].items()]
    lines += ["", "Not checked:", "", *(f"- {item}" for item in report["not_checked"]), ""]
    return "\n".join(lines)


def summary_row(name: str, run: dict[str, Any]) -> str:
    """One run's row: its figures, and "yes" or the checks it failed."""
    if "error" in run:
        return f"| {name} | {run['error']} | | | | | | | | no |"
    failed = [check for check, passed in run.get("checks", {}).items() if not passed]
    cells = [
        name,
        run["device_name"] or run["device"],
        run["tokens_per_s"],
        run["step_ms_median"],
        None if run["mfu"] is None else f"{run['mfu']:.1%}",
        _mib(run["peak_memory_bytes"]),
        _mib(run.get("plan_bytes")),
        run.get("step_ratio"),
        _short(run.get("loss_deviation")),
        ("no: " + ", ".join(failed)) if failed else "yes" if name != REFERENCE else "reference",
    ]
    return "| " + " | ".join("-" if cell is None else str(cell) for cell in cells) + " |"


def _mib(value: float | None) -> str | None:
    return None if value is None else f"{value / MIB:,.0f}"


def _short(value: float | None) -> str | None:
    return None if value is None else f"{value:.1e}"


def selected(names: Sequence[str] | None) -> list[Run]:
    """The plain loop and the engine runs named (every one when None)."""
    known = [run.name for run in RUNS if not run.plain]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ToolkitError(f"--runs {','.join(unknown)}: no such run", f"choose from {known}")
    return [run for run in RUNS if run.plain or names is None or run.name in names]


def check(out: Path, size_name: str, names: Sequence[str] | None = None) -> int:
    """The runs, each in its own process, within BUDGET_S; the report into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    specs: dict[str, TrainSpec] = {}
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as scratch:
        for run in selected(names):
            path, specs[run.name] = run_spec(run, SIZES[size_name], Path(scratch))
            left = BUDGET_S - (time.monotonic() - started)
            if left <= 0:
                results[run.name] = {"error": f"not run: the check's {BUDGET_S:.0f} s were spent"}
                continue
            found = start_run(run, size_name, path, Path(scratch) / f"{run.name}.json", left)
            results[run.name] = found
            print(
                f"{run.name}: {found.get('error', 'done')} in {found['wall_seconds']} s", flush=True
            )
            for line in found.get("output_tail", ()):
                print(f"  {line}")
    report = build_report(size_name, results, specs, time.monotonic() - started)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gpu_check.md").write_text(summary(report))
    print(summary(report))
    return 0 if report["passed"] else 1


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("check", help="run the check; the report into OUT")
    run.add_argument("out", type=Path)
    run.add_argument("--size", choices=sorted(SIZES), default="gpt2-small")
    run.add_argument(
        "--runs",
        type=lambda text: text.split(","),
        help="engine runs to hold to the plain loop, e.g. ddp,zero3 (default: all)",
    )
    wheels = commands.add_parser("wheels", help="the wheelhouse's sizes, needs and budget")
    wheels.add_argument("folder", type=Path)
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args(sys.argv[1:])
    if args.command == "wheels":
        return check_wheels(args.folder)
    return check(args.out, args.size, args.runs)


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main))
