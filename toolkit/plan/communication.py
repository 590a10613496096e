"""Bytes each rank sends per optimizer step, and the pipeline bubble.

Ring collectives over N ranks, each rank sending (formulas as nccl-tests and the ZeRO paper
count them, P parameters, c bytes per communicated gradient element, w per weight element):

- allreduce of the gradients (DDP, Horovod, TensorFlow, ZeRO-0, ZeRO-1 at the step boundary):
  2(N-1)/N · P · c, once per step (every engine accumulates micro-batches locally first).
- ZeRO-2: a reduce-scatter of the gradients, (N-1)/N · P · c, after every micro-batch (it keeps
  only its partition), and an all-gather of the updated weights, (N-1)/N · P · w, per step.
- ZeRO-3: the reduce-scatter per micro-batch as ZeRO-2, plus two all-gathers of the weights per
  micro-batch (forward and backward): (N-1)/N · P · (c + 2w) per micro-batch.
- Pipeline with p stages: each micro-batch's activations forward and their gradients backward
  across every stage boundary (point to point), and the data-parallel allreduce of each stage's
  gradients among the N/p replicas of that stage.

The pipeline bubble, the idle fraction of a step, is (p-1)/(m+p-1) for m micro-batches per
step (GPipe's and 1F1B's alike), for stages of equal cost with free hand-offs. DeepSpeed's
pipeline sits somewhat above it, because its point-to-point hand-offs block
(docs/engine-notes.md, DeepSpeed); the plan keeps the formula.
"""

from __future__ import annotations

from toolkit.spec import TrainSpec


def allreduce_bytes(parameters: float, ranks: int, element_bytes: float) -> float:
    """What each rank sends in a ring allreduce of `parameters` elements."""
    return 2.0 * (ranks - 1) / ranks * parameters * element_bytes if ranks > 1 else 0.0


def gradient_bytes(spec: TrainSpec, *, zero_engine: bool) -> float:
    """Bytes per communicated gradient element: DeepSpeed sends in the model's dtype (16 bits
    under bf16/fp16); autocast engines hold fp32 gradients; an fp16 or bf16 cast on the wire
    (`compression`) halves them. PowerSGD's low-rank factors are not counted: figured as fp32."""
    if zero_engine and spec.precision != "fp32":
        return 2.0
    if not zero_engine and spec.wire_compression in ("fp16", "bf16"):
        return 2.0
    return 4.0


def zero_bytes(
    spec: TrainSpec, *, stage: int, parameters: float, ranks: int, micro_batches: int
) -> float:
    c = gradient_bytes(spec, zero_engine=True)
    w = 2.0 if spec.precision != "fp32" else 4.0
    share = (ranks - 1) / ranks * parameters if ranks > 1 else 0.0
    if stage <= 1:
        return allreduce_bytes(parameters, ranks, c)
    if stage == 2:
        return share * (c * micro_batches + w)
    return share * (c + 2.0 * w) * micro_batches


def fsdp_bytes(spec: TrainSpec, *, parameters: float, shard: int, micro_batches: int) -> float:
    """FSDP2 per step and rank: every micro-batch all-gathers the parameters for forward and,
    after a reshard, again for backward (in the compute dtype); the gradients are
    reduce-scattered once, with the last micro-batch (in fsdp.reduce_dtype under bf16)."""
    share = (shard - 1) / shard * parameters if shard > 1 else 0.0
    w = 2.0 if spec.precision == "bf16" else 4.0
    gathers = 2.0 if spec.fsdp.reshard_after_forward else 1.0
    reduced = 2.0 if spec.precision == "bf16" and spec.fsdp.reduce_dtype == "bf16" else 4.0
    return share * (gathers * w * micro_batches + reduced)


def pipeline_bytes(
    spec: TrainSpec,
    *,
    stage_parameters: float,
    data_parallel: int,
    boundary_elements: float,
    micro: int,
    micro_batches: int,
) -> float:
    """One interior stage: activations out and gradients back per micro-batch, both boundaries
    counted once (a rank sends forward on one and backward on the other), plus its replicas'
    allreduce."""
    activation = 2.0 if spec.precision != "fp32" else 4.0
    p2p = 2.0 * boundary_elements * micro * activation * micro_batches
    c = gradient_bytes(spec, zero_engine=True)
    return p2p + allreduce_bytes(stage_parameters, data_parallel, c)


def bubble(stages: int, micro_batches: int) -> float:
    """Idle fraction of a pipeline step: (p-1)/(m+p-1)."""
    return (stages - 1) / (micro_batches + stages - 1)
