"""`toolkit bench memory`: `toolkit plan` against what real CPU runs through the toolkit hold.

Each case runs the probe (ranks/memory_probe.py) under its engine's launcher with 2 ranks, a
bigger MLP than the step bench's (so that model states dwarf the allocator's noise), Adam and
fp32 by default. Compared, per rank:

- optimizer state: the census of optimizer-state tensors against the plan's optimizer component
  (the ZeRO formula: k·P/N under ZeRO-1/2/3, k·P otherwise);
- tensors: the census of every live torch tensor after the steps against the plan's model
  states (it misses what C++ holds, like DDP's buckets, and what a step frees, like ZeRO-2's
  gradient partition);
- resident memory: anonymous + shared-memory pages at the step's high points (as each
  gradient collective and each optimizer step begins) minus the same before the model
  existed, against the plan's total (model states + engine buffers + activations); the
  probe's docstring says what it leaves out (library code, the allocator's free pages, the
  engines' lazy imports) and why. After the steps and the peak during them likewise; the peak
  also holds the step's temporaries (Adam's per-parameter denominator, backward's gradients
  before they reach a bucket), which no plan counts.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.bench.launching import failure, launch_with_spec
from toolkit.launch.machine_settings import for_this_machine
from toolkit.parity.cases import merge
from toolkit.plan.model_facts import ModelFacts
from toolkit.plan.table import plan_rows
from toolkit.ports import free_port, free_port_range
from toolkit.spec import TrainSpec
from toolkit.units import MIB

PROBE = str(Path(__file__).parent / "ranks" / "memory_probe.py")
DEFAULT_LAYERS = (512, 4096, 4096, 512, 10)
TIMEOUT_S = 600
SPEC_SECTIONS = ("optimizer", "precision", "zero", "ddp", "horovod")
"""What `--spec` gives every case: the math and the engines' buffer settings (each case sets
its backend, ZeRO stage and launcher itself)."""


@dataclass(frozen=True)
class MemoryCase:
    name: str
    spec: dict[str, Any]
    plan_row: str
    """The `toolkit plan` row this case measures."""


MEMORY_CASES: tuple[MemoryCase, ...] = (
    MemoryCase("ddp/torchrun", {"backend": "ddp", "launch": {"launcher": "torchrun"}}, "ddp+torch"),
    MemoryCase(
        "horovod/horovodrun",
        {"backend": "horovod", "launch": {"launcher": "horovodrun"}},
        "horovod+torch",
    ),
    *(
        MemoryCase(
            f"zero{stage}/deepspeed",
            {"backend": "deepspeed", "zero": {"stage": stage}},
            f"deepspeed zero-{stage}",
        )
        for stage in range(4)
    ),
)


def spec_changes(spec: dict[str, Any]) -> dict[str, Any]:
    """The fields of `SPEC_SECTIONS` where `spec` (a TrainSpec's dict) differs from the
    defaults: what the cases take from `--spec`, and what the report names."""
    defaults = TrainSpec().to_dict()
    changes: dict[str, Any] = {}
    for section in SPEC_SECTIONS:
        value, default = spec[section], defaults[section]
        if isinstance(value, dict):
            changed = {k: v for k, v in value.items() if v != default.get(k)}
            if changed:
                changes[section] = changed
        elif value != default:
            changes[section] = value
    return changes


def mlp_facts(widths: tuple[int, ...]) -> ModelFacts:
    """The plan's view of the bench MLP (Linear, ReLU, ..., Linear), without building it."""
    params: list[int] = []
    outputs: list[int] = []
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        params.append(fan_in * fan_out + fan_out)
        outputs.append(fan_out)
        if index < len(widths) - 2:
            params.append(0)
            outputs.append(fan_out)
    return ModelFacts(
        parameters=sum(params),
        largest_layer=max(params),
        layer_parameters=tuple(params),
        layer_activations=tuple(outputs),
        input_elements=widths[0],
        source="bench MLP " + "-".join(map(str, widths)),
    )


def case_spec(case: MemoryCase, base: dict[str, Any], micro: int) -> TrainSpec:
    data = merge(
        TrainSpec().to_dict(),
        base,
        case.spec,
        {
            "batch": {"global": micro * 2, "micro": micro, "accumulation": None},
            "launch": {"np": 2, "threads_per_rank": 1, "master_port": free_port()},
            "tf": {"port": free_port_range(2)},
        },
    )
    return TrainSpec.from_dict(data)


def compare(
    spec: TrainSpec, facts: ModelFacts, row_name: str, measured: dict[str, Any]
) -> dict[str, Any]:
    """The plan of `spec` as `toolkit launch` ran it on this machine (Horovod's controller, and
    with it the fusion buffer, resolved for horovodrun here) beside what the run measured."""
    spec = for_this_machine(spec)
    row = next(r for r in plan_rows(spec, facts, spec.world_size) if r.name == row_name)
    planned = row.memory
    baseline = measured["resident_baseline"]
    at_step = measured["resident_at_step"] - baseline
    after = measured["resident_after_steps"] - baseline
    peak = measured["resident_peak"] - baseline
    optimizer = planned.device.get("optimizer", 0.0) + planned.host.get("optimizer", 0.0)
    return {
        "plan_row": row_name,
        "plan": planned.to_json(),
        "measured": measured,
        "optimizer_state": {
            "plan": optimizer,
            "measured": measured["optimizer_state"],
            "ratio": measured["optimizer_state"] / optimizer if optimizer else None,
        },
        "tensors": {
            "plan_model_states": planned.model_states,
            "census": measured["tensors"],
            "ratio": measured["tensors"] / planned.model_states,
        },
        "resident": {
            "plan_total": planned.total,
            "at_step_delta": at_step,
            "after_delta": after,
            "peak_delta": peak,
            "ratio": at_step / planned.total,
            "after_ratio": after / planned.total,
            "peak_ratio": peak / planned.total,
        },
    }


def run_memory(
    work: Path,
    *,
    layers: tuple[int, ...] = DEFAULT_LAYERS,
    micro: int = 64,
    base: dict[str, Any] | None = None,
    cases: tuple[MemoryCase, ...] = MEMORY_CASES,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    facts = mlp_facts(layers)
    results, errors = [], []
    for index, case in enumerate(cases):
        spec = case_spec(case, base or {}, micro)
        directory = work / f"memory{index}"
        directory.mkdir(parents=True)
        out, modules = directory / "memory.json", directory / "modules.json"
        args = ["--layers", ",".join(map(str, layers))]
        log(f"{case.name}: loading the engine's modules once")
        outcome = launch_with_spec(
            spec,
            directory,
            PROBE,
            [*args, "--modules-out", str(modules)],
            timeout=TIMEOUT_S,
        )
        reason = failure(outcome, wrote=modules.exists(), missing="no module list written")
        if not reason:
            log(f"{case.name}: measuring")
            args += ["--preload", str(modules), "--out", str(out)]
            outcome = launch_with_spec(spec, directory, PROBE, args, timeout=TIMEOUT_S)
            reason = failure(outcome, wrote=out.exists(), missing="no results written")
        if reason:
            log(f"  FAILED: {reason.splitlines()[0]}")
            errors.append(f"{case.name}: {reason}")
            continue
        ranks = json.loads(out.read_text())
        rank0 = ranks[0]
        results.append(
            {"case": case.name, **compare(spec, facts, case.plan_row, rank0), "ranks": ranks}
        )
    return {
        "model": {"layers": list(layers), "parameters": facts.parameters, "micro": micro},
        "spec": base or {},
        "cases": results,
        "errors": errors,
    }


def table(data: dict[str, Any]) -> str:
    lines = [
        f"model: MLP {'-'.join(map(str, data['model']['layers']))} "
        f"({data['model']['parameters']:,} parameters), micro {data['model']['micro']}, 2 ranks; "
        "MiB on rank 0; resident memory growth at the step's high points, after the steps "
        "and at the peak",
        f"{'case':22}{'optim plan':>11}{'measured':>10}{'ratio':>7}"
        f"{'states plan':>12}{'tensors':>9}{'ratio':>7}"
        f"{'plan total':>12}{'at step':>9}{'ratio':>7}{'after':>9}{'ratio':>7}"
        f"{'peak':>9}{'ratio':>7}",
    ]
    for case in data["cases"]:
        o, t, r = case["optimizer_state"], case["tensors"], case["resident"]
        ratio = "-" if o["ratio"] is None else f"{o['ratio']:.3f}"
        lines.append(
            f"{case['case']:22}{o['plan'] / MIB:11.1f}{o['measured'] / MIB:10.1f}{ratio:>7}"
            f"{t['plan_model_states'] / MIB:12.1f}{t['census'] / MIB:9.1f}{t['ratio']:7.3f}"
            f"{r['plan_total'] / MIB:12.1f}{r['at_step_delta'] / MIB:9.1f}{r['ratio']:7.3f}"
            f"{r['after_delta'] / MIB:9.1f}{r['after_ratio']:7.3f}"
            f"{r['peak_delta'] / MIB:9.1f}{r['peak_ratio']:7.3f}"
        )
    for error in data["errors"]:
        lines.append(f"error: {error.splitlines()[0]}")
    return "\n".join(lines)
