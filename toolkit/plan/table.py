"""The rows `toolkit plan` prints: every engine of the engine table (and every ZeRO stage and
offload choice of DeepSpeed, and its pipeline when the spec has one) for one spec and model."""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolkit import engines
from toolkit.plan import communication as comm
from toolkit.plan import memory as mem
from toolkit.plan.model_facts import ModelFacts
from toolkit.spec import TrainSpec
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
        recomputed = self.spec.activation_checkpointing.modules
        sample = self.facts.kept_per_sample(recomputed) if per_sample is None else per_sample
        if sample is None:
            return None
        return float(sample * self.micro * mem.activation_bytes(self.spec) * in_flight)


def ddp_rows(s: Setting) -> list[PlanRow]:
    p = s.facts.parameters
    # Gradients that are views into the buckets need no second copy (ddp.gradient_as_bucket_view).
    buckets = 0.0 if s.spec.ddp.gradient_as_bucket_view else 4.0 * p
    memory = mem.replicated(s.spec, p, buffers=buckets, activations=s.activations())
    sent = comm.allreduce_bytes(p, s.ranks, comm.gradient_bytes(s.spec, zero_engine=False))
    note = "buffers: DDP's gradient buckets" if buckets else ""
    return [PlanRow("ddp+torch", memory, sent, note=note)]


def fsdp_rows(s: Setting) -> list[PlanRow]:
    """FSDP2 over its shard groups (parallel.replicate of them), with and without CPU offload.
    With tensor parallelism the planned layers are split over the tensor-parallel group first,
    and FSDP shards what each rank holds over `parallel.shard` ranks."""
    layout = s.spec.layout_for(s.ranks)
    planned = s.facts.planned_parameters(s.spec.parallel.tensor_plan) if layout.tensor > 1 else 0
    held = s.facts.parameters - planned + math.ceil(planned / layout.tensor)
    notes = [] if s.facts.largest_layer_known else ["largest layer = model"]
    if layout.tensor > 1 and not s.facts.named_layers:
        notes.append(f"tensor {layout.tensor}: layers unknown, nothing split")
    elif layout.tensor > 1:
        notes.append(f"tensor {layout.tensor}: {planned} planned parameters split")
        notes.append("its activation all-reduces not counted")
    rows = []
    for offload in (False, True):
        memory = mem.fsdp(
            s.spec,
            parameters=held,
            largest_layer=s.facts.largest_layer,
            shard=layout.shard,
            activations=s.activations(),
            offload=offload,
        )
        sent = comm.fsdp_bytes(
            s.spec, parameters=held, shard=layout.shard, micro_batches=s.micro_batches
        )
        name = "fsdp+torch" + (f" tensor {layout.tensor}" if layout.tensor > 1 else "")
        name += " offload cpu" if offload else ""
        rows.append(PlanRow(name, memory, sent, note="; ".join(notes)))
    return rows


def _horovod(s: Setting, framework: str) -> list[PlanRow]:
    p = s.facts.parameters
    threshold = float(s.spec.horovod.fusion_threshold * MIB)
    layers = [4.0 * n for n in s.facts.layer_parameters]
    fusion = mem.horovod_fusion_bytes(threshold, layers, gradient_bytes=4.0 * p)
    memory = mem.replicated(s.spec, p, buffers=fusion, activations=s.activations())
    sent = comm.allreduce_bytes(p, s.ranks, comm.gradient_bytes(s.spec, zero_engine=False))
    return [PlanRow(f"horovod+{framework}", memory, sent, note="buffers: fusion buffer")]


def horovod_torch_rows(s: Setting) -> list[PlanRow]:
    return _horovod(s, "torch")


def horovod_tf_rows(s: Setting) -> list[PlanRow]:
    return _horovod(s, "tensorflow")


def tf_rows(s: Setting) -> list[PlanRow]:
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


def deepspeed_rows(s: Setting) -> list[PlanRow]:
    rows = []
    for layout in ZERO_LAYOUTS:
        memory = mem.zero(
            s.spec,
            layout,
            parameters=s.facts.parameters,
            largest_layer=s.facts.largest_layer,
            ranks=s.ranks,
            activations=s.activations(),
            first_layer=s.facts.first_layer,
        )
        sent = comm.zero_bytes(
            s.spec,
            stage=layout.stage,
            parameters=s.facts.parameters,
            ranks=s.ranks,
            micro_batches=s.micro_batches,
        )
        notes = []
        if not s.facts.largest_layer_known and layout.stage == 3:
            notes.append("largest layer = model")
        note = "; ".join(notes)
        rows.append(PlanRow(layout_name(layout), memory, sent, note=note))
    if s.spec.parallel.pipeline > 1:
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
    stages, facts = s.spec.parallel.pipeline, s.facts
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
    memory = mem.zero(
        s.spec,
        mem.ZeroLayout(stage=min(s.spec.zero.stage, 1)),
        parameters=stage_params,
        largest_layer=facts.largest_layer,
        ranks=max(data_parallel, 1),
        activations=activations,
    )
    sent = comm.pipeline_bytes(
        s.spec,
        stage_parameters=stage_params,
        data_parallel=max(data_parallel, 1),
        boundary_elements=boundary,
        micro=batch.micro,
        micro_batches=batch.accumulation,
    )
    notes = []
    if not cuts:
        notes.append("layers unknown: P/p per stage, activations not sent counted")
    note = "; ".join(notes)
    name = f"deepspeed pipeline p={stages} m={batch.accumulation}"
    return PlanRow(name, memory, sent, comm.bubble(stages, batch.accumulation), note)


PlanRule = Callable[[Setting], list[PlanRow]]
"""How one engine holds a model: its rows of the plan. Each engine's row of the engine table
names its rule (`Engine.plan_rule`)."""


def plan_rule(entry: engines.Engine) -> PlanRule:
    module_name, _, name = entry.plan_rule.partition(":")
    rule: PlanRule = getattr(importlib.import_module(module_name), name)
    return rule


TF_PRECISIONS = ("fp32",)


def plan_rows(spec: TrainSpec, facts: ModelFacts, ranks: int) -> list[PlanRow]:
    setting = Setting(spec, facts, ranks)
    rows: list[PlanRow] = []
    for entry in engines.ENGINES:
        if entry.framework == "tensorflow" and spec.precision not in TF_PRECISIONS:
            continue  # the TensorFlow engines run fp32 only (toolkit.backends.tf.common)
        rows.extend(plan_rule(entry)(setting))
    return rows
