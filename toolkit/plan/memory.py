"""Bytes per rank, by component, for each engine and ZeRO stage, with and without offload.

Components (bytes per rank; P parameters, N data-parallel ranks, L the largest layer):

- parameters: the model's weights in the model's dtype (w = 2 when DeepSpeed runs bf16/fp16,
  which casts the module; 4 otherwise, also under torch autocast).
- gradients: in the model's dtype, or the fp32 partition ZeRO keeps for its optimizer step.
- master: the fp32 copy of the weights ZeRO's optimizer updates, 4P/N at every stage, also
  when the model is fp32. ZeRO-3 means to share an fp32 partition instead of cloning it, but
  DeepSpeed 0.19.8 (`_create_fp32_partitions` in stage3.py) tests `tensor.device ==
  self.device`, a torch.device against the accelerator's device name, a str, which torch 2.13
  never finds equal (`torch.device("cpu") == "cpu"` is False), so it clones
  (docs/engine-notes.md, DeepSpeed).
- optimizer: fp32 states, k bytes per parameter: Adam/AdamW 8 (two moments), SGD with momentum
  4, plain SGD 0.
- working: ZeRO-3's gathered weights and the gradients not yet in a bucket, at its high point, a
  gradient reduction in backward (`zero3_working`).
- buffers: engine communication buffers, not in DeepSpeed's estimators but resident on a real
  run: DDP's gradient buckets (a second copy of the gradients unless ddp.gradient_as_bucket_view
  makes the gradients views into them), Horovod's fusion
  buffer (the most a step touches, `horovod_fusion_bytes`), ZeRO-2/3's contiguous gradient
  bucket (the touched part; beside it, ZeRO-2 reduces a layer larger than the bucket in that
  layer's own gradient, `zero2_buckets`), ZeRO-3's flattened copy of it (`reduce_scatter_coalesced`
  concatenates the bucket to reduce it), ZeRO-0's flattened copy of the gradients it
  all-reduces, and ZeRO-1/2's flattened copy of what they reduce at a time, at most the
  bucket, min(bucket, P)·w more while they reduce: with `use_multi_rank_bucket_allreduce`,
  DeepSpeed's default, a copy of the whole bucket all-reduced (`allreduce_and_scatter` in
  stage_1_and_2.py); with the spec's default (`zero.multi_rank_bucket_allreduce: false`) a copy
  of each owner's share reduced to it (`allreduce_no_retain`), which a bucket inside one
  owner's partition makes the whole bucket (both ways hold the same high point). These last
  exist only during the reduction; ZeRO-1/2's fp32 gradient partition exists only after it
  (`step()` builds it from the reduced gradients and drops it when the step ends), so the
  total counts the larger of the two (`Memory.never_together`). ZeRO-1 in fp32 reduces after
  backward, with every gradient alive, and clears those outside the rank's partition before
  the step: they too are never beside the fp32 partition. How close the plan came to measured
  memory is in docs/engine-notes.md.
- activations: what backward keeps, micro × what autograd saves for one sample (a probe forward
  pass, toolkit.plan.model_facts) × activation bytes, when the model is known; with
  activation checkpointing, each recomputed module's input plus the largest one's saved
  tensors; under the pipeline, the first stage holds min(m, p) micro-batches.

With those, mixed-precision Adam gives DeepSpeed's own estimates exactly: ZeRO-2 per rank
2P + 18P/N on the device (18 = 2 fp16 gradients + 4 fp32 gradients + 4 fp32 weights + 8 Adam),
ZeRO-3 4L + 18P/N (the fp16 gradients live only in the gathered layer, the reduced gradient
goes to an fp32 partition; the plan's 4L holds where the bucket is smaller than the model,
the large models their estimator is for); with the optimizer offloaded, 16P/N per rank moves to
the host (and the fp16 gradient partition is not kept), with the parameters offloaded too,
18P/N.
tests/test_plan.py holds the plan to DeepSpeed's `estimate_zero2/3_model_states_mem_needs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from toolkit.spec import TrainSpec

COMPONENTS = ("parameters", "gradients", "master", "optimizer", "working", "buffers")
MODEL_STATES = ("parameters", "gradients", "master", "optimizer", "working")


@dataclass(frozen=True, kw_only=True)
class Memory:
    """Bytes per rank: `device` is where the model computes, `host` what offload moves out.
    On a machine without accelerators both are the same RAM, and the total is what counts."""

    device: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    activations: float | None = None
    never_together: float = 0.0
    """Bytes counted in two components that the engine never holds at the same time (the
    smaller of the two), left out of the total: what ZeRO-1/2 hold only while they reduce (the
    flattened copy of what they reduce; ZeRO-2's gradient of a layer larger than the bucket;
    ZeRO-1's gradients outside the rank's partition, in fp32) is freed before their fp32
    gradient partition is filled."""

    def _sum(self, names: tuple[str, ...]) -> float:
        return sum(self.device.get(n, 0.0) + self.host.get(n, 0.0) for n in names)

    @property
    def model_states(self) -> float:
        return self._sum(MODEL_STATES)

    @property
    def device_model_states(self) -> float:
        return sum(self.device.get(n, 0.0) for n in MODEL_STATES)

    @property
    def host_model_states(self) -> float:
        return sum(self.host.get(n, 0.0) for n in MODEL_STATES)

    @property
    def total(self) -> float:
        return self._sum(COMPONENTS) + (self.activations or 0.0) - self.never_together

    @property
    def device_total(self) -> float:
        """What the device holds at the high point: the total less what offload moves to the
        host (what is never held together is always on the device)."""
        return self.total - sum(self.host.values())

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "model_states": self.model_states,
            "device_model_states": self.device_model_states,
            "host_model_states": self.host_model_states,
            "total": self.total,
        }


def optimizer_bytes(spec: TrainSpec) -> int:
    """fp32 optimizer state per parameter."""
    opt = spec.optimizer
    if opt.name == "sgd":
        return 4 if opt.momentum > 0 else 0
    return 8


def half(spec: TrainSpec) -> bool:
    return spec.precision != "fp32"


def activation_bytes(spec: TrainSpec) -> int:
    return 2 if half(spec) else 4


def replicated(
    spec: TrainSpec, parameters: int, *, buffers: float, activations: float | None
) -> Memory:
    """An engine that keeps everything on every rank in fp32 (DDP, Horovod, TensorFlow):
    autocast computes in 16 bits but keeps fp32 weights and gradients."""
    return Memory(
        device={
            "parameters": 4.0 * parameters,
            "gradients": 4.0 * parameters,
            "master": 0.0,
            "optimizer": float(optimizer_bytes(spec) * parameters),
            "working": 0.0,
            "buffers": buffers,
        },
        activations=activations,
    )


@dataclass(frozen=True, kw_only=True)
class ZeroLayout:
    stage: int
    offload_optimizer: bool = False
    offload_params: bool = False


def horovod_fusion_bytes(
    threshold: float, layer_gradient_bytes: Sequence[float], gradient_bytes: float
) -> float:
    """The most of Horovod's fusion buffer a step touches. Horovod copies gradients into the
    buffer only when it fuses two or more into one reduction; a tensor reduced alone is reduced
    in place (`AllreduceOp` in horovod/common/ops). A layer whose gradients are larger than the
    buffer fuses with nothing, so the buffer holds at most the gradients of the layers smaller
    than it, and never more than its size; without the model's layers (`layer_gradient_bytes`
    empty), min(buffer, every gradient, `gradient_bytes`).

    How much of that a step reaches depends on time, which no plan knows: Horovod fuses what
    became ready within one cycle (horovod.cycle_time_ms), and runs touched well under the
    bound (docs/engine-notes.md, Horovod). The bound is what a plan that must not promise too
    little can give."""
    if not layer_gradient_bytes:
        return min(threshold, gradient_bytes)
    return min(threshold, sum(b for b in layer_gradient_bytes if b < threshold))


def zero2_buckets(w: float, parameters: float, bucket: float, largest_layer: float) -> float:
    """ZeRO-2's bucket bytes at its high point, a reduction in backward: the contiguous bucket
    and its flattened copy, or, when a layer is larger than the bucket, the bucket beside
    that layer's own gradient, which DeepSpeed reduces alone and in place
    (`extra_large_param_to_reduce` in stage_1_and_2.py)."""
    held = min(bucket, parameters)
    oversized = bucket + largest_layer if largest_layer > bucket else 0.0
    return w * max(2.0 * held, oversized)


def zero3_working(
    parameters: float, bucket: float, largest_layer: float, first_layer: float | None
) -> float:
    """Elements of ZeRO-3's working set at its high point, a gradient reduction in backward
    (the reduce-scatter, where a rank's memory peaks):

    - a bucket that holds every gradient is reduced once, as backward ends. By then backward has
      released every gathered layer but the first, whose input needs no gradient, so the hook
      that releases it does not run before the step's leftovers are released: w·first layer
      (the largest when the layers are unknown);
    - a smaller bucket is reduced when a gradient does not fit: that layer's gathered weights
      and its whole gradient are alive, 2·w·L at worst (DeepSpeed's estimator's term)."""
    if bucket >= parameters:
        return largest_layer if first_layer is None else first_layer
    return 2.0 * largest_layer


def zero(
    spec: TrainSpec,
    layout: ZeroLayout,
    *,
    parameters: int,
    largest_layer: int,
    ranks: int,
    activations: float | None,
    first_layer: int | None = None,
) -> Memory:
    """DeepSpeed's engine at a ZeRO stage (0 = its plain data parallelism); see module docs.
    `first_layer`: parameters of the model's first layer, when known (ZeRO-3's working set)."""
    p, n, stage = float(parameters), ranks, layout.stage
    w = 2.0 if half(spec) else 4.0
    k = float(optimizer_bytes(spec))
    bucket = float(spec.zero.reduce_bucket_size)
    reduce_bucket = min(bucket, p) * w
    device: dict[str, float] = dict.fromkeys(COMPONENTS, 0.0)
    host: dict[str, float] = {}
    if stage == 0:
        device["parameters"] = w * p
        device["gradients"] = w * p + (4.0 * p if half(spec) else 0.0)
        device["master"] = 4.0 * p / n if half(spec) else 0.0  # bf16/fp16 optimizer: partitioned
        device["optimizer"] = k * p / n if half(spec) else k * p
        device["buffers"] = w * p  # the flattened allreduce bucket
        return Memory(device=device, activations=activations)
    fp32_grad_partition = 4.0 * p / n
    states = {"master": 4.0 * p / n, "optimizer": k * p / n}
    if stage == 1:
        device["parameters"] = w * p
        device["gradients"] = w * p + (0.0 if layout.offload_optimizer else fp32_grad_partition)
        device["buffers"] = reduce_bucket  # the flattened copy it reduces
    elif stage == 2:
        device["parameters"] = w * p
        grad16 = 0.0 if layout.offload_optimizer or not half(spec) else w * p / n
        device["gradients"] = grad16 + (0.0 if layout.offload_optimizer else fp32_grad_partition)
        device["buffers"] = zero2_buckets(w, p, bucket, largest_layer)
    else:
        device["parameters"] = w * p / n
        device["gradients"] = 0.0 if layout.offload_optimizer else fp32_grad_partition
        device["working"] = w * zero3_working(p, bucket, largest_layer, first_layer)
        device["buffers"] = 2.0 * reduce_bucket  # the contiguous bucket and its flattened copy
    reducing = device["buffers"]  # what only the reduction holds
    never_together = 0.0
    if stage in (1, 2) and not layout.offload_optimizer:
        # ZeRO-1 in fp32 reduces after backward, with every gradient alive, and its epilogue
        # clears those outside this rank's partition before the step (`_clear_param_grad_only`)
        cleared = w * p * (1.0 - 1.0 / n) if stage == 1 and not half(spec) else 0.0
        never_together = min(fp32_grad_partition, reducing + cleared)
    if layout.offload_optimizer:
        host.update(states, gradients=fp32_grad_partition)
        if layout.offload_params and stage == 3:
            host["parameters"] = device["parameters"]
            device["parameters"] = 0.0
    else:
        device.update(states)
    return Memory(device=device, host=host, activations=activations, never_together=never_together)


def fsdp(
    spec: TrainSpec,
    *,
    parameters: int,
    largest_layer: int,
    shard: int,
    activations: float | None,
    offload: bool = False,
) -> Memory:
    """FSDP2 (`fully_shard`) over a shard group of `shard` ranks: fp32 parameters, gradients
    and optimizer state sharded 1/shard (the sharded parameters are the optimizer's fp32
    masters, so there is no separate master copy); working: the gathered unit and the next one
    it prefetches, in the compute dtype, and one unit's unsharded fp32 gradient before its
    reduce-scatter (the largest layer standing for a unit); with reshard_after_forward false the
    gathered parameters stay from forward to backward, the whole model at the high point. With
    offload the shards live on the host."""
    p, n = float(parameters), shard
    w = 2.0 if spec.precision == "bf16" else 4.0
    gathered = w * p if not spec.fsdp.reshard_after_forward else 2.0 * w * largest_layer
    states = {
        "parameters": 4.0 * p / n,
        "gradients": 4.0 * p / n,
        "optimizer": float(optimizer_bytes(spec)) * p / n,
    }
    device: dict[str, float] = dict.fromkeys(COMPONENTS, 0.0)
    device["working"] = gathered + 4.0 * largest_layer
    host: dict[str, float] = {}
    if offload:
        host.update(states)
    else:
        device.update(states)
    return Memory(device=device, host=host, activations=activations)
