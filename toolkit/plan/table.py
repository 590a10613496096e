"""The rows `toolkit plan` prints: every engine of the engine table (and every ZeRO stage and
offload choice of DeepSpeed, and its pipeline when the spec has one) for one spec and model."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolkit import engines
from toolkit.plan import communication as comm
from toolkit.plan import memory as mem
from toolkit.plan.model_facts import ModelFacts
from toolkit.shm_layout import mailbox_bytes, mailboxes_per_rank, segment_bytes
from toolkit.spec import TrainSpec
from toolkit.spec.fields import AllreduceTransport
from toolkit.units import MIB


@dataclass(frozen=True)
class PlanRow:
    name: str
    memory: mem.Memory
    bytes_per_step: float
    bubble: float | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "memory": self.memory.to_json(),
            "bytes_per_step": self.bytes_per_step,
            "bubble": self.bubble,
            "note": self.note,
        }


@dataclass(frozen=True)
class Setting:
    """What every row needs: the spec, the model, the ranks and the resolved batch."""

    spec: TrainSpec
    facts: ModelFacts
    ranks: int

    @property
    def micro(self) -> int:
        return self.spec.batch_for(self.ranks).micro

    @property
    def micro_batches(self) -> int:
        return self.spec.batch_for(self.ranks).accumulation

    def activations(self, per_sample: float | None = None, in_flight: int = 1) -> float | None:
        sample = self.facts.activations_per_sample if per_sample is None else per_sample
        if sample is None:
            return None
        return float(sample * self.micro * mem.activation_bytes(self.spec) * in_flight)


def _ddp(s: Setting) -> list[PlanRow]:
    p = s.facts.parameters
    # Gradients that are views into the buckets need no second copy (ddp.gradient_as_bucket_view).
    buckets = 0.0 if s.spec.ddp.gradient_as_bucket_view else 4.0 * p
    segment = float(segment_bytes(s.ranks)) if _shared_memory(s, s.spec.ddp.allreduce) else 0.0
    memory = mem.replicated(s.spec, p, buffers=buckets + segment, activations=s.activations())
    sent = comm.allreduce_bytes(p, s.ranks, comm.gradient_bytes(s.spec, zero_engine=False))
    parts = []
    if buckets:
        parts.append("DDP's gradient buckets")
    if segment:
        parts.append("the shared-memory segment")
    note = f"buffers: {', '.join(parts)}" if parts else ""
    return [PlanRow("ddp+torch", memory, sent, note=note)]


def _shared_memory(s: Setting, choice: AllreduceTransport) -> bool:
    """Whether an engine reduces through the shared-memory segment (toolkit.backends.
    shared_memory), as far as the spec tells: `shared_memory`, or `auto` with more than one rank
    and every rank on one host. At run time `auto` also needs x86-64 and /dev/shm."""
    one_host = len(s.spec.hosts) <= 1
    return s.ranks > 1 and (choice == "shared_memory" or (choice == "auto" and one_host))


def _horovod(framework: str) -> Callable[[Setting], list[PlanRow]]:
    def rows(s: Setting) -> list[PlanRow]:
        p = s.facts.parameters
        threshold = float(s.spec.horovod.fusion_threshold * MIB)
        layers = [4.0 * n for n in s.facts.layer_parameters]
        fusion = mem.horovod_fusion_bytes(threshold, layers, gradient_bytes=4.0 * p)
        memory = mem.replicated(s.spec, p, buffers=fusion, activations=s.activations())
        sent = comm.allreduce_bytes(p, s.ranks, comm.gradient_bytes(s.spec, zero_engine=False))
        return [PlanRow(f"horovod+{framework}", memory, sent, note="buffers: fusion buffer")]

    return rows


def _tf(s: Setting) -> list[PlanRow]:
    p = s.facts.parameters
    memory = mem.replicated(s.spec, p, buffers=0.0, activations=s.activations())
    sent = comm.allreduce_bytes(p, s.ranks, 4.0)
    return [PlanRow("tf+tensorflow", memory, sent)]


ZERO_LAYOUTS = (
    mem.ZeroLayout(stage=0),
    mem.ZeroLayout(stage=1),
    mem.ZeroLayout(stage=1, offload_optimizer=True),
    mem.ZeroLayout(stage=2),
    mem.ZeroLayout(stage=2, offload_optimizer=True),
    mem.ZeroLayout(stage=3),
    mem.ZeroLayout(stage=3, offload_optimizer=True),
    mem.ZeroLayout(stage=3, offload_optimizer=True, offload_params=True),
)


def layout_name(layout: mem.ZeroLayout) -> str:
    name = f"deepspeed zero-{layout.stage}"
    if layout.offload_params:
        return name + " offload opt+params"
    return name + (" offload opt" if layout.offload_optimizer else "")


def _deepspeed(s: Setting) -> list[PlanRow]:
    rows = []
    # Every ZeRO stage reduces its gradients and gathers its weights through it (toolkit.
    # backends.deepspeed.shared_memory_comm).
    segment = (
        float(segment_bytes(s.ranks)) if _shared_memory(s, s.spec.deepspeed.allreduce) else 0.0
    )
    for layout in ZERO_LAYOUTS:
        memory = mem.zero(
            s.spec,
            layout,
            parameters=s.facts.parameters,
            largest_layer=s.facts.largest_layer,
            ranks=s.ranks,
            activations=s.activations(),
            first_layer=s.facts.first_layer,
            segment=segment,
        )
        sent = comm.zero_bytes(
            s.spec,
            stage=layout.stage,
            parameters=s.facts.parameters,
            ranks=s.ranks,
            micro_batches=s.micro_batches,
        )
        notes = []
        if segment:
            notes.append("buffers: the shared-memory segment")
        if not s.facts.largest_layer_known and layout.stage == 3:
            notes.append("largest layer = model")
        note = "; ".join(notes)
        rows.append(PlanRow(layout_name(layout), memory, sent, note=note))
    if s.spec.pipeline.stages > 1:
        rows.append(_pipeline(s))
    return rows


def stage_split(layer_parameters: tuple[int, ...], stages: int) -> list[int]:
    """Index of the last layer of each stage, balancing parameters the way DeepSpeed's
    partition_method="parameters" aims to (contiguous stages, the largest as small as it can
    be; found greedily against the ideal share)."""
    total = sum(layer_parameters)
    cuts: list[int] = []
    running = 0
    for index, count in enumerate(layer_parameters):
        running += count
        if len(cuts) < stages - 1 and running >= total * (len(cuts) + 1) / stages:
            cuts.append(index)
    return cuts


def _pipeline(s: Setting) -> PlanRow:
    stages, facts = s.spec.pipeline.stages, s.facts
    data_parallel = s.ranks // stages
    layers = facts.layer_parameters
    cuts = stage_split(layers, stages) if layers else []
    if cuts:
        bounds = [-1, *cuts, len(layers) - 1]
        stage_params = max(sum(layers[a + 1 : b + 1]) for a, b in itertools.pairwise(bounds))
        first_activations = float(sum(facts.layer_activations[: cuts[0] + 1]))
        boundary = float(max(facts.layer_activations[c] for c in cuts))
    else:
        stage_params = math.ceil(facts.parameters / stages)
        first_activations, boundary = float("nan"), 0.0
    batch = s.spec.batch_for(s.ranks)
    in_flight = min(batch.accumulation, stages)
    activations = (
        s.activations(per_sample=facts.input_elements + first_activations, in_flight=in_flight)
        if facts.layer_activations
        else None
    )
    # The rings of the mailboxes this stage sends and receives through (toolkit.backends.
    # shared_memory_p2p); the other ranks' rings in the segment it never touches.
    mailboxes = (
        float(mailbox_bytes(mailboxes_per_rank(stages)))
        if _shared_memory(s, s.spec.deepspeed.send_recv)
        else 0.0
    )
    memory = mem.zero(
        s.spec,
        mem.ZeroLayout(stage=min(s.spec.zero.stage, 1)),
        parameters=stage_params,
        largest_layer=facts.largest_layer,
        ranks=max(data_parallel, 1),
        activations=activations,
        segment=mailboxes,
    )
    sent = comm.pipeline_bytes(
        s.spec,
        stage_parameters=stage_params,
        data_parallel=max(data_parallel, 1),
        boundary_elements=boundary,
        micro=batch.micro,
        micro_batches=batch.accumulation,
    )
    notes = ["buffers: the pipeline's shared-memory mailboxes"] if mailboxes else []
    if not cuts:
        notes.append("layers unknown: P/p per stage, activations not sent counted")
    note = "; ".join(notes)
    name = f"deepspeed pipeline p={stages} m={batch.accumulation}"
    return PlanRow(name, memory, sent, comm.bubble(stages, batch.accumulation), note)


RULES: dict[tuple[str, str], Callable[[Setting], list[PlanRow]]] = {
    ("ddp", "torch"): _ddp,
    ("horovod", "torch"): _horovod("torch"),
    ("deepspeed", "torch"): _deepspeed,
    ("tf", "tensorflow"): _tf,
    ("horovod", "tensorflow"): _horovod("tensorflow"),
}
"""How each engine of the table holds a model; an engine without a rule is listed as such."""

TF_PRECISIONS = ("fp32",)


def plan_rows(spec: TrainSpec, facts: ModelFacts, ranks: int) -> list[PlanRow]:
    setting = Setting(spec, facts, ranks)
    rows: list[PlanRow] = []
    for entry in engines.ENGINES:
        if entry.framework == "tensorflow" and spec.precision not in TF_PRECISIONS:
            continue  # the TensorFlow engines run fp32 only (toolkit.backends.tf.common)
        rule = RULES.get((entry.backend, entry.framework))
        if rule is not None:
            rows.extend(rule(setting))
    return rows
