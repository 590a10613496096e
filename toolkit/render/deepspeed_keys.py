"""What a DeepSpeed config key does, for `spec from-deepspeed`: keys that change no math are
never refused. Logging, monitors and profilers are carried as written (the spec's
`deepspeed.observability`, toolkit.spec.deepspeed_section.OBSERVABILITY). The rest are left out
with a note at the top of the written spec: DeepSpeed's own checkpoint and I/O tuning, defaults
written out, disabled features, keys DeepSpeed does not read. Keys that change the math stay
modelled or refused (toolkit.render.deepspeed_import).

Paths are dotted as written in the config; defaults are DeepSpeed 0.19.8's
(`runtime/zero/config.py`, `runtime/precision_config.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NO_MATH: dict[str, str] = {
    "checkpoint": "DeepSpeed's own checkpoint engine; the toolkit writes its own checkpoints",
    "aio": "NVMe I/O tuning",
    "zero_optimization.load_from_fp32_weights": "how DeepSpeed reloads its own checkpoints",
    "zero_optimization.elastic_checkpoint": "how DeepSpeed saves its own checkpoints",
    "zero_optimization.ignore_unused_parameters": "whether ZeRO-1/2 errors on unused parameters",
    "zero_optimization.memory_efficient_linear": "ZeRO-3 memory of linear layers, the same math",
    "zero_optimization.round_robin_gradients": "the order ZeRO-1/2 copies gradients to the host",
    "zero_optimization.stage3_model_persistence_threshold": "which ZeRO-3 parameters stay whole",
    "zero_optimization.offload_optimizer.buffer_count": "NVMe offload buffers",
    "zero_optimization.offload_optimizer.pipeline_read": "NVMe offload read overlap",
    "zero_optimization.offload_optimizer.pipeline_write": "NVMe offload write overlap",
    "zero_optimization.offload_param.buffer_count": "NVMe offload buffers",
    "zero_optimization.offload_param.buffer_size": "NVMe offload buffers",
    "zero_optimization.offload_param.max_in_cpu": "how many offloaded parameters stay in memory",
    "activation_checkpointing.contiguous_memory_optimization": "where kept activations live",
    "activation_checkpointing.number_checkpoints": "the size of that contiguous buffer",
    "activation_checkpointing.synchronize_checkpoint_boundary": "a device sync for timing",
    "activation_checkpointing.profile": "timing of the recomputation",
    "hybrid_engine": "DeepSpeed-Chat's inference kernels for generation; training is the same",
    "autotuning": "read only by `deepspeed --autotuning`, which searches configs before a run",
    "disable_allgather": "DeepSpeed 0.19.8 parses it, and no code of it reads it",
    "cuda_visible_devices": "DeepSpeed reads no such key (the launcher's --include does this)",
    "comms_config": "DeepSpeed reads no such key (its comms logging is comms_logger)",
    "monitor_config": "DeepSpeed reads no such key (its monitors are top-level keys)",
}
"""Keys that change no math and that the toolkit does not render: left out, with why."""

DEFAULTS: dict[str, Any] = {
    "fp16.fp16_master_weights_and_grads": False,
    "zero_optimization.zero_quantized_weights": False,
    "zero_optimization.zero_quantized_gradients": False,
    "zero_optimization.zero_hpz_partition_size": 1,
}
"""Keys the spec models only at DeepSpeed's default: written out at it, they are left out with
a note; any other value changes the math and is refused."""

DEPRECATED: dict[str, str] = {
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
}
"""zero_optimization keys DeepSpeed still reads under an old name -> the current name."""


def disabled(value: Any, *, top_level: bool) -> bool:
    """A feature switched off: a section with enabled: false, or a top-level false (a switch
    such as sparse_gradients; a false deeper down may be a setting that is not DeepSpeed's
    default)."""
    if isinstance(value, Mapping):
        return value.get("enabled") is False
    return top_level and value is False


def nearest_dtype(value: str) -> str:
    """The dtype of the same family as a misspelt one ("bfp16" -> bf16, "half16" -> fp16)."""
    lowered = value.lower()
    if "b" in lowered:
        return "bf16"
    return "fp16" if "16" in lowered or "half" in lowered else "fp32"
