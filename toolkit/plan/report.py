"""`toolkit plan` output: a text table in MiB, and the same rows as JSON."""

from __future__ import annotations

from typing import Any

from toolkit.plan.model_facts import ModelFacts
from toolkit.plan.table import PlanRow
from toolkit.units import MIB


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:,.1f}"


def text(rows: list[PlanRow], facts: ModelFacts, ranks: int, header: str) -> str:
    lines = [
        header,
        f"model: {facts.parameters:,} parameters, largest layer {facts.largest_layer:,}"
        + ("" if facts.largest_layer_known else " (unknown: the whole model)")
        + f"; {ranks} ranks; MiB per rank",
        "",
        f"{'engine':38}{'params':>9}{'grads':>9}{'master':>9}{'optim':>9}{'working':>9}"
        f"{'buffers':>9}{'activ.':>9}{'host':>9}{'total':>10}{'sent/step':>11}{'bubble':>8}",
    ]
    for row in rows:
        memory = row.memory

        def both(name: str, memory: Any = memory) -> float:
            return float(memory.device.get(name, 0.0) + memory.host.get(name, 0.0))

        bubble = "-" if row.bubble is None else f"{row.bubble:.3f}"
        notes = [row.note] if row.note else []
        if memory.never_together:
            notes.append(f"total less {_mib(memory.never_together)} never held together")
        lines.append(
            f"{row.name:38}{_mib(both('parameters')):>9}{_mib(both('gradients')):>9}"
            f"{_mib(both('master')):>9}{_mib(both('optimizer')):>9}{_mib(both('working')):>9}"
            f"{_mib(both('buffers')):>9}{_mib(memory.activations):>9}"
            f"{_mib(sum(memory.host.values())):>9}{_mib(memory.total):>10}"
            f"{_mib(row.bytes_per_step):>11}{bubble:>8}"
            + (f"  ({'; '.join(notes)})" if notes else "")
        )
    lines.append("")
    lines.append(
        "host = what offload moves off the device (included in the columns before it); "
        "sent/step = MiB each rank sends per optimizer step; ZeRO-1/2 free the flattened "
        "copy of the gradients they reduce before they fill their fp32 gradient partition"
    )
    return "\n".join(lines)


def to_json(
    rows: list[PlanRow], facts: ModelFacts, ranks: int, spec: dict[str, Any]
) -> dict[str, Any]:
    return {
        "model": {
            "parameters": facts.parameters,
            "largest_layer": facts.largest_layer,
            "largest_layer_known": facts.largest_layer_known,
            "activations_per_sample": facts.activations_per_sample,
            "source": facts.source,
        },
        "ranks": ranks,
        "spec": spec,
        "rows": [row.to_json() for row in rows],
    }
