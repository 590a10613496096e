"""An existing DeepSpeed config -> spec data, so teams with ds_config.json files can adopt.

The reverse of `toolkit.render.deepspeed`. Every key is accounted for:
- mapped onto the spec (batch, optimizer, clipping, precision, loss scaling, ZeRO, pipeline);
- accepted silently when it holds the value the toolkit writes anyway (e.g. reduce_scatter
  true, gradient_allreduce_op "mean");
- reported as a warning when the spec does not model it and it is dropped (scheduler,
  monitors, ...), or when a value was "auto" or missing and a default is written instead
  (notably a missing gradient_clipping, which DeepSpeed treats as 1.0);
- reported as an error when the spec cannot express what the config does to the math
  ("auto" batch sizes or learning rate, another optimizer type, summed gradients).
Errors come back together as one SpecError with paths under `deepspeed.`.

Longer than most modules on purpose: it is the one key-by-key account of DeepSpeed's config
schema, so the fate of every DeepSpeed key (mapped, accepted, dropped, refused) is in one place.

Whatever the config holds (it is a user's file), the importer ends in the spec's own error or
a spec: values are shown through the spec's bounded `show_value`, never compared by hashing,
and whole-number floats (JSON's 5e8) become integers where the spec wants an integer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolkit.spec import SpecError, SpecIssue, TrainSpec
from toolkit.spec.errors import show_value

AUTO = "auto"


@dataclass(frozen=True, kw_only=True)
class Imported:
    """The result of importing a DeepSpeed config."""

    data: dict[str, Any]
    """Spec data (file keys) holding only what the config said, for writing as YAML."""
    spec: TrainSpec
    """That data, validated."""
    warnings: list[str]
    """Keys dropped or defaulted, each naming the key."""


class _Reader:
    """Reads one mapping of the config, remembering which keys were used."""

    def __init__(self, data: Any, path: str, out: _Report) -> None:
        self.path = path
        self.out = out
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            out.error(path, data, "must be a mapping", hint="write it as a JSON object {...}")
            data = {}
        self.data = dict(data)
        self.used: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        """The value, or `default` (with a warning for "auto"; an error if required)."""
        self.used.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        if value == AUTO:
            if required:
                self.out.error(
                    f"{self.path}.{key}",
                    value,
                    "must be given explicitly, not auto",
                    hint="write the value your job uses in place of auto",
                )
            else:
                self.out.warn(f"{self.path}.{key}: 'auto' is not supported; wrote {default!r}")
            return default
        return value

    def get_int(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        """`get` for a key the spec holds as an integer: 5e8 (JSON's way) becomes 500000000."""
        return _whole(self.get(key, default, required=required))

    def expect(self, key: str, value: Any) -> None:
        """A key the toolkit always writes as `value`: accepted if equal, else warned."""
        self.used.add(key)
        if key in self.data and self.data[key] != value:
            self.out.warn(
                f"{self.path}.{key}={show_value(self.data[key])} is not modeled; "
                f"the toolkit writes {value!r}"
            )

    def sub(self, key: str) -> _Reader:
        self.used.add(key)
        return _Reader(self.data.get(key), f"{self.path}.{key}", self.out)

    def finish(self) -> None:
        for key in self.data:
            if key not in self.used:
                self.out.warn(f"{self.path}.{_name(key)} is not modeled by the spec; dropped")


class _Report:
    def __init__(self) -> None:
        self.errors: list[SpecIssue] = []
        self.warnings: list[str] = []

    def error(self, path: str, value: Any, allowed: str, hint: str) -> None:
        self.errors.append(SpecIssue(path=path, value=value, allowed=allowed, hint=hint))

    def warn(self, message: str) -> None:
        self.warnings.append(message)


def _optimizer(ds: _Reader, out: _Report) -> dict[str, Any] | None:
    if not ds.has("optimizer"):
        ds.used.add("optimizer")
        out.warn("deepspeed.optimizer is missing (the script passes its own); wrote the default")
        return None
    section = ds.sub("optimizer")
    params = section.sub("params")
    kind_value = section.get("type", "")
    kind = kind_value.lower() if isinstance(kind_value, str) else ""
    result: dict[str, Any] = {"name": kind, "lr": params.get("lr", required=True)}
    if kind in ("adam", "adamw"):
        adam_w_mode = params.get("adam_w_mode")
        torch_adam = params.get("torch_adam", False)
        name = "adamw" if kind == "adamw" or adam_w_mode is not False else "adam"
        if kind == "adam" and adam_w_mode is None:
            out.warn(
                "deepspeed.optimizer: type Adam without adam_w_mode runs AdamW in DeepSpeed "
                "(decoupled weight decay); wrote optimizer.name: adamw"
            )
        result["name"] = name
        result["betas"] = params.get("betas", [0.9, 0.999])
        result["eps"] = params.get("eps", 1e-8)
        # Defaults of the optimizer DeepSpeed builds: torch.optim.AdamW decays 0.01, the rest 0.
        result["weight_decay"] = params.get(
            "weight_decay", 0.01 if torch_adam and name == "adamw" else 0.0
        )
        params.expect("amsgrad", False)
        params.expect("bias_correction", True)
    elif kind == "sgd":
        result["name"] = "sgd"
        result["momentum"] = params.get("momentum", 0.0)
        result["weight_decay"] = params.get("weight_decay", 0.0)
        result["nesterov"] = params.get("nesterov", False)
        params.expect("dampening", 0.0)
    else:
        out.error(
            "deepspeed.optimizer.type",
            section.data.get("type"),
            "allowed Adam, AdamW, SGD",
            hint="the spec models sgd, adam and adamw",
        )
    params.finish()
    section.finish()
    return result


def _name(key: Any) -> str:
    """A config key for a message (keys of a parsed JSON file are strings; others are shown)."""
    return key if isinstance(key, str) else show_value(key)


def _whole(value: Any) -> Any:
    """An integral finite float as an int (JSON configs write 5e8); anything else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _offload(zero: _Reader, key: str, deprecated: str) -> tuple[str, bool | None, Any]:
    section = zero.sub(key)
    device = section.get("device", "none")
    pin = section.get("pin_memory")
    nvme = section.get("nvme_path")
    section.finish()
    if zero.get(deprecated):
        zero.out.warn(
            f"deepspeed.zero_optimization.{deprecated} is deprecated; read as cpu offload"
        )
        device = "cpu"
    return device, pin, nvme


def _zero(ds: _Reader, out: _Report) -> dict[str, Any]:
    zero = ds.sub("zero_optimization")
    result: dict[str, Any] = {"stage": zero.get_int("stage", 0)}
    opt_device, opt_pin, opt_nvme = _offload(zero, "offload_optimizer", "cpu_offload")
    par_device, par_pin, par_nvme = _offload(zero, "offload_param", "cpu_offload_param")
    result["offload_optimizer"] = opt_device
    result["offload_params"] = par_device
    nvme = opt_nvme or par_nvme
    if nvme:
        result["nvme_path"] = nvme  # the spec refuses anything but a path
    # Compared, not put in a set: a pin_memory of [] or {} must be refused by the spec, not crash.
    pins = [pin for pin in (opt_pin, par_pin) if pin is not None]
    if len(pins) == 2 and pins[0] != pins[1]:
        out.warn("deepspeed.zero_optimization: offload pin_memory differs; wrote the optimizer's")
    if pins:
        result["pin_memory"] = pins[0]
    names = {
        "reduce_bucket_size": "reduce_bucket_size",
        "allgather_bucket_size": "allgather_bucket_size",
        "overlap_comm": "overlap_comm",
        "contiguous_gradients": "contiguous_gradients",
        "stage3_prefetch_bucket_size": "prefetch_bucket_size",
        "stage3_param_persistence_threshold": "param_persistence_threshold",
        "stage3_max_live_parameters": "max_live_parameters",
        "stage3_max_reuse_distance": "max_reuse_distance",
        "stage3_gather_16bit_weights_on_model_save": "gather_16bit_weights_on_model_save",
    }
    for spec_key, alias in names.items():
        for ds_key in (spec_key, alias):
            if zero.has(ds_key):
                value = zero.get_int(ds_key)
                if value is not None:
                    result[spec_key] = value
            zero.used.add(ds_key)
    if result.get("overlap_comm") == (result["stage"] == 3):
        del result["overlap_comm"]  # DeepSpeed's own rule, which the spec's default keeps
    zero.expect("reduce_scatter", True)
    zero.expect("allgather_partitions", True)
    zero.expect("round_robin_gradients", False)
    zero.finish()
    return result


def _precision(ds: _Reader) -> tuple[str, dict[str, Any] | None]:
    fp16 = ds.sub("fp16")
    bf16 = ds.sub("bf16") if ds.has("bf16") else ds.sub("bfloat16")
    fp16_on = fp16.get("enabled", False, required=True)
    bf16_on = bf16.get("enabled", False, required=True)
    bf16.finish()
    precision = "fp16" if fp16_on is True else "bf16" if bf16_on is True else "fp32"
    scaling = {
        name: fp16.get(name)
        if name in ("loss_scale", "consecutive_hysteresis")
        else fp16.get_int(name)
        for name in (
            "loss_scale",
            "initial_scale_power",
            "loss_scale_window",
            "hysteresis",
            "consecutive_hysteresis",
            "min_loss_scale",
        )
        if fp16.has(name)
    }
    fp16.expect("auto_cast", False)
    fp16.finish()
    return precision, scaling or None


def _pipeline(ds: _Reader, out: _Report) -> dict[str, Any] | None:
    if not ds.has("pipeline"):
        return None
    pipe = ds.sub("pipeline")
    result: dict[str, Any] = {"stages": pipe.get_int("stages", 1)}
    partition = pipe.get("partition", "parameters")
    if partition == "best":
        out.warn("deepspeed.pipeline.partition 'best' is not modeled; wrote parameters")
        partition = "parameters"
    result["partition"] = partition
    result["activation_checkpoint_interval"] = pipe.get_int("activation_checkpoint_interval", 0)
    for key, value in (
        ("seed_layers", False),
        ("pipe_partitioned", True),
        ("grad_partitioned", True),
    ):
        pipe.expect(key, value)
    pipe.finish()
    return {key: value for key, value in result.items() if value is not None}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _infer_world_size(batch: dict[str, Any], stages: Any) -> int | None:
    """World size from a full batch triple: global / (micro * accumulation) data-parallel ranks."""
    values: list[Any] = [batch.get(key) for key in ("global", "micro", "accumulation")]
    if not all(_positive_int(value) for value in [*values, stages]):
        return None
    global_, micro, accumulation = (int(value) for value in values)
    if global_ % (micro * accumulation):
        return None
    return global_ // (micro * accumulation) * int(stages)


def _batch(ds: _Reader) -> dict[str, Any]:
    batch = {
        "global": ds.get_int("train_batch_size", required=True),
        "micro": ds.get_int("train_micro_batch_size_per_gpu", required=True),
        "accumulation": ds.get_int("gradient_accumulation_steps", required=True),
    }
    return {key: value for key, value in batch.items() if value is not None}


def spec_from_deepspeed(config: Any, *, world_size: int | None = None) -> Imported:
    """Import a DeepSpeed config dict; SpecError when it holds what the spec cannot express."""
    out = _Report()
    ds = _Reader(config, "deepspeed", out)
    data: dict[str, Any] = {"backend": "deepspeed"}
    optimizer = _optimizer(ds, out)
    precision, scaling = _precision(ds)
    zero = _zero(ds, out)
    pipeline = _pipeline(ds, out)
    stages = pipeline.get("stages", 1) if pipeline else 1
    data["batch"] = batch = _batch(ds)
    np = world_size if world_size is not None else _infer_world_size(batch, stages)
    if np is None:
        out.warn("world size unknown: launch.np not written; pass --world-size to set it")
    if optimizer is not None:
        data["optimizer"] = optimizer
    if not ds.has("gradient_clipping"):
        out.warn(
            "deepspeed.gradient_clipping is missing: DeepSpeed clips at 1.0 by default; wrote 1.0"
        )
    data["clip_grad_norm"] = ds.get("gradient_clipping", 1.0)
    data["precision"] = precision
    if scaling:
        data["loss_scaling"] = scaling
    data["zero"] = zero
    if pipeline:
        data["pipeline"] = pipeline
    if ds.has("steps_per_print"):
        data["log_every_steps"] = ds.get_int("steps_per_print")
    if np is not None:
        data["launch"] = {"np": np}
    _derived(ds, precision, out)
    ds.finish()
    if out.errors:
        raise SpecError(out.errors)
    return Imported(data=data, spec=TrainSpec.from_dict(data), warnings=out.warnings)


def _derived(ds: _Reader, precision: str, out: _Report) -> None:
    """Keys the renderer derives: they must agree with what the spec implies."""
    op = ds.get("gradient_allreduce_op", "mean")
    if op != "mean":
        out.error(
            "deepspeed.gradient_allreduce_op",
            op,
            "allowed mean",
            hint="every engine averages gradients; scale the learning rate instead",
        )
    ds.expect("prescale_gradients", False)
    ds.expect("gradient_predivide_factor", 1.0)
    ds.used.update(("zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"))
    ds.expect("wall_clock_breakdown", False)
    comm = ds.get("communication_data_type")
    if comm is not None and comm != precision:
        out.warn(
            f"deepspeed.communication_data_type={show_value(comm)} is not modeled; "
            f"wrote {precision!r}"
        )
    types = ds.sub("data_types")
    accum = types.get("grad_accum_dtype")
    if accum is not None and accum != precision:
        out.warn(
            f"deepspeed.data_types.grad_accum_dtype={show_value(accum)} is not modeled; "
            f"wrote {precision!r}"
        )
    types.finish()
