"""An existing DeepSpeed config -> spec data, so teams with ds_config.json files can adopt.

The reverse of `toolkit.render.deepspeed`, with no silent path. Every key of the config is:
- modelled: mapped onto the spec (batch, optimizer with bias correction or "the script's own",
  clipping, precision, loss scaling, ZeRO, pipeline, DeepSpeed's WarmupLR / WarmupDecayLR
  schedules, and the `deepspeed` section: guard flags, pre-division, auto_cast, dtypes);
- or accepted because it holds what the toolkit writes anyway (reduce_scatter true,
  gradient_allreduce_op "mean"), or what DeepSpeed itself ignores (offload_param below ZeRO
  stage 3, which only stage 3 reads);
- or carried as written when it changes no math: logging, monitors and profilers
  (`deepspeed.observability`);
- or left out with a note when it changes no math and is not rendered (DeepSpeed's own
  checkpoint and I/O settings, defaults written out, disabled features, keys DeepSpeed does not
  read: toolkit.render.deepspeed_keys);
- or dropped: math not modelled (other schedulers and optimizers, ...) or removed from
  DeepSpeed. A dropped key is an error naming it (`deepspeed_input.Report.strict_issues`), unless
  the caller asks for a lossy import, which records each dropped key with its value.
Every substitution (an optimizer implementation, a value DeepSpeed itself repairs) is a note.
"auto" values (Hugging Face's placeholders) must all be filled first (`--set`).

Errors name DeepSpeed's keys as written in the config (`zero_optimization.stage`), also when
the spec refuses an imported value: `_Build` remembers which config key each spec field came
from. Defaults are DeepSpeed's own (a missing gradient_clipping clips at 1.0; type Adam without
adam_w_mode runs AdamW; a missing reduce_bucket_size is 5e8 elements, where the spec's default
is smaller; a missing use_multi_rank_bucket_allreduce or compute_grad_norm is true, where the
spec's default is false), written out explicitly and noted.

Whatever the config holds (it is a user's file), the importer ends in a ToolkitError or a spec:
values are shown through the spec's bounded `show_value`, and whole-number floats (JSON's 5e8)
become integers where the spec wants an integer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from toolkit.render import deepspeed_keys as keys
from toolkit.render.deepspeed_input import (
    AutoValuesError,
    ConfigReader,
    DeepSpeedConfigError,
    Dropped,
    Report,
    auto_paths,
)
from toolkit.spec import SpecError, SpecIssue, TrainSpec
from toolkit.spec.deepspeed_section import OBSERVABILITY
from toolkit.spec.errors import show_value
from toolkit.spec.sections import REDUCE_BUCKET_ELEMENTS

ADAM_TYPES = ("adam", "adamw")
DEEPSPEED_REDUCE_BUCKET = 500_000_000
"""DeepSpeed's `reduce_bucket_size` when a config leaves it out; the spec's default is smaller
(toolkit.spec.sections.REDUCE_BUCKET_ELEMENTS), so an imported job keeps the one it ran with."""
DEEPSPEED_SECTION = "deepspeed"
"""The spec section holding DeepSpeed-only keys (toolkit.spec.deepspeed_section)."""
DTYPES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "half": "fp16"}
DTYPES |= {"bf16": "bf16", "bfloat16": "bf16"}


@dataclass(frozen=True, kw_only=True)
class Imported:
    """The result of importing a DeepSpeed config."""

    data: dict[str, Any]
    """Spec data (file keys) holding only what the config said, for writing as YAML."""
    spec: TrainSpec
    """That data, validated."""
    warnings: list[str]
    """Notes on defaults written out and keys DeepSpeed ignores; nothing here changes the math."""
    dropped: list[Dropped]
    """Keys not carried into the spec (only in a lossy import; a strict one refuses them)."""
    left_out: list[Dropped]
    """Keys that change no math and are not rendered (toolkit.render.deepspeed_keys)."""


class _Build:
    """Spec data under construction, remembering the config key behind each spec field."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"backend": "deepspeed"}
        self.origin: dict[str, str] = {}

    def put(self, spec_path: str, ds_path: str, value: Any) -> None:
        *sections, key = spec_path.split(".")
        node = self.data
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
        self.origin[spec_path] = ds_path

    def ds_issue(self, issue: SpecIssue) -> SpecIssue:
        """`issue` named by the config key its field came from (the longest known prefix)."""
        path = issue.path
        while path and path not in self.origin:
            path = path.rpartition(".")[0]
        return replace(issue, path=self.origin[path]) if path else issue


def _whole(value: Any) -> Any:
    """An integral finite float as an int (JSON configs write 5e8); anything else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _copy(out: _Build, reader: ConfigReader, names: dict[str, str], *, whole: bool) -> None:
    """Each config key of `names` that is present -> its spec path."""
    for key, spec_path in names.items():
        if reader.has(key):
            value = reader.get(key)
            out.put(spec_path, reader.at(key), _whole(value) if whole else value)


def _optimizer(ds: ConfigReader, out: _Build, report: Report) -> str | None:
    """The optimizer section; returns the FusedAdam note (`_fused_adam`) where it may apply."""
    if not ds.has("optimizer"):
        out.put("optimizer.name", "optimizer", "script")
        report.note("no optimizer section: optimizer.name script (the script passes its own)")
        return None
    section = ds.sub("optimizer")
    params = section.sub("params")
    kind_value = section.get("type", "")
    kind = kind_value.lower() if isinstance(kind_value, str) else ""
    if kind not in (*ADAM_TYPES, "sgd"):
        # Nothing of it is kept: the lossy spec says the script must bring the optimizer.
        out.put("optimizer.name", "optimizer.type", "script")
        report.drop(
            "optimizer", section.data, "optimizer type not modelled (allowed Adam, AdamW, SGD)"
        )
        return None
    fused = None
    adam_w_mode = params.get("adam_w_mode") if kind in ADAM_TYPES else None
    name = (
        kind
        if kind == "sgd"
        else "adamw"
        if kind == "adamw" or adam_w_mode is not False
        else "adam"
    )
    out.put("optimizer.name", section.at("type"), name)
    _copy(
        out, params, {"lr": "optimizer.lr", "weight_decay": "optimizer.weight_decay"}, whole=False
    )
    if kind in ADAM_TYPES:
        torch_adam = params.get("torch_adam", False)
        if torch_adam is not True and params.get("bias_correction") is not False:
            fused = _fused_adam(kind_value, name)
        if kind == "adam" and adam_w_mode is None:
            report.note("optimizer type Adam without adam_w_mode runs AdamW in DeepSpeed: adamw")
        names = {"betas": "optimizer.betas", "eps": "optimizer.eps"}
        _copy(out, params, names | {"bias_correction": "optimizer.bias_correction"}, whole=False)
        if not params.has("weight_decay"):
            # The optimizer DeepSpeed builds: torch.optim.AdamW decays 0.01, the others 0.
            decay = 0.01 if torch_adam is True and name == "adamw" else 0.0
            out.put("optimizer.weight_decay", params.at("weight_decay"), decay)
        params.expect("amsgrad", False)
    else:
        names = {"momentum": "optimizer.momentum", "nesterov": "optimizer.nesterov"}
        _copy(out, params, names, whole=False)
        params.expect("dampening", 0.0)
    params.finish()
    section.finish()
    return fused


def _fused_adam(kind: str, name: str) -> str:
    """The note for an Adam config without torch_adam: DeepSpeed builds its FusedAdam (GPUs)
    there, where the toolkit renders torch's own Adam(W). Given only when the optimizer is not
    offloaded (then it is DeepSpeed's CPU Adam either way)."""
    return (
        f"optimizer type {kind} without torch_adam runs DeepSpeed's FusedAdam on GPUs; the "
        f"toolkit renders torch_adam: true (torch.optim.{'AdamW' if name == 'adamw' else 'Adam'}, "
        "the same update rule)"
    )


def _scheduler(ds: ConfigReader, out: _Build, report: Report) -> None:
    """DeepSpeed's WarmupLR / WarmupDecayLR: the spec's warmup_constant / warmup_linear
    (toolkit.schedule) with warmup_shape from warmup_type; their peak, warmup_max_lr, is the
    learning rate. DeepSpeed reads a missing or unknown warmup_type as log (it only logs a
    warning for an unknown one), so the spec gets log too, written out."""
    if not ds.has("scheduler"):
        return
    section = ds.sub("scheduler")
    kind = section.get("type")
    params = section.sub("params")
    if kind not in ("WarmupLR", "WarmupDecayLR"):
        report.drop("scheduler", section.data, f"scheduler type {show_value(kind)} is not modelled")
        return
    warmup_type = params.get("warmup_type", "log")
    shape = warmup_type if warmup_type in ("linear", "log") else "log"
    if shape != warmup_type:
        report.note(
            f"scheduler.params.warmup_type {show_value(warmup_type)}: DeepSpeed reads an "
            "unknown warmup_type as log; imported as warmup_shape: log"
        )
    low, peak = params.get("warmup_min_lr", 0.0), params.get("warmup_max_lr", 0.001)
    steps = _whole(params.get("warmup_num_steps", 1000))
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, peak, steps)):
        report.error(section.at("params"), params.data, "must hold numbers", "fix the values")
        return
    if peak <= 0 or not 0 <= low <= peak:
        report.drop("scheduler", section.data, "warmup_min_lr must be in [0, warmup_max_lr]")
        return
    if isinstance(steps, int) and steps < 2:
        report.note(
            f"scheduler.params.warmup_num_steps {steps}: DeepSpeed warms up over at least 2 "
            "steps (max(2, warmup_num_steps)); wrote 2"
        )
    name = "warmup_constant" if kind == "WarmupLR" else "warmup_linear"
    out.put("schedule.name", section.at("type"), name)
    out.put("schedule.warmup_steps", params.at("warmup_num_steps"), max(2, steps))
    out.put("schedule.warmup_shape", params.at("warmup_type"), shape)
    out.put("schedule.warmup_start_ratio", params.at("warmup_min_lr"), low / peak)
    out.put("optimizer.lr", params.at("warmup_max_lr"), peak)
    if kind == "WarmupDecayLR":
        total = _whole(params.get("total_num_steps"))
        out.put("schedule.total_steps", params.at("total_num_steps"), total)
        out.put("schedule.min_ratio", params.at("warmup_min_lr"), low / peak)
    params.expect("last_batch_iteration", -1)
    params.finish()
    section.finish()
    report.note(
        "scheduler: the toolkit steps it in line with optimizer steps (plain DeepSpeed starts "
        "it one step behind; see toolkit.schedule)"
    )


def _offload(zero: ConfigReader, key: str, deprecated: str) -> tuple[Any, Any, Any]:
    section = zero.sub(key)
    device = section.get("device", "none")
    pin, nvme = section.get("pin_memory"), section.get("nvme_path")
    section.finish()
    if zero.get(deprecated):
        zero.out.note(f"zero_optimization.{deprecated} is deprecated; read as cpu offload")
        device = "cpu"
    return device, pin, nvme


_ZERO_NAMES = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "overlap_comm": "overlap_comm",
    "contiguous_gradients": "contiguous_gradients",
    "sub_group_size": "sub_group_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save": "gather_16bit_weights_on_model_save",
}
"""Spec zero keys (DeepSpeed's names) and DeepSpeed's aliases for them."""


def _zero(ds: ConfigReader, out: _Build) -> None:
    zero = ds.sub("zero_optimization")
    stage = _whole(zero.get("stage", 0))
    out.put("zero.stage", zero.at("stage"), stage)
    opt = _offload(zero, "offload_optimizer", "cpu_offload")
    par = _offload(zero, "offload_param", "cpu_offload_param")
    out.put("zero.offload_optimizer", zero.at("offload_optimizer.device"), opt[0])
    if par[0] not in (None, "none") and isinstance(stage, int) and stage in (0, 1, 2):
        ds.out.note(f"zero_optimization.offload_param: DeepSpeed ignores it at stage {stage}")
        par = ("none", None, None)
    out.put("zero.offload_params", zero.at("offload_param.device"), par[0])
    nvme = opt[2] or par[2]
    if nvme:
        out.put("zero.nvme_path", zero.at("offload_optimizer.nvme_path"), nvme)
    # Compared, not put in a set: a pin_memory of [] or {} must be refused by the spec.
    pins = [pin for pin in (opt[1], par[1]) if pin is not None]
    if len(pins) == 2 and pins[0] != pins[1]:
        ds.out.drop(
            zero.at("offload_param.pin_memory"), pins[1], "differs from offload_optimizer's"
        )
    if pins:
        out.put("zero.pin_memory", zero.at("offload_optimizer.pin_memory"), pins[0])
    for spec_key, alias in _ZERO_NAMES.items():
        for ds_key in (spec_key, alias):
            if zero.has(ds_key) and zero.data[ds_key] is not None:
                out.put(f"zero.{spec_key}", zero.at(ds_key), _whole(zero.get(ds_key)))
            zero.used.add(ds_key)
    for old_name, current in keys.DEPRECATED.items():
        if zero.has(old_name) and not zero.has(current):
            out.put(f"zero.{current}", zero.at(old_name), zero.get(old_name))
            ds.out.note(
                f"zero_optimization.{old_name} is DeepSpeed's deprecated name; read as {current}"
            )
        zero.used.add(old_name)
    zero_data = out.data["zero"]
    if "reduce_bucket_size" not in zero_data:
        zero_data["reduce_bucket_size"] = DEEPSPEED_REDUCE_BUCKET
        ds.out.note(
            "zero_optimization.reduce_bucket_size is missing: DeepSpeed's default is 5e8; wrote "
            f"{DEEPSPEED_REDUCE_BUCKET} (the toolkit's own default, {REDUCE_BUCKET_ELEMENTS}, "
            "keeps ZeRO-1/2's per-step bucket off fresh pages on a CPU)"
        )
    _multi_rank_bucket_allreduce(zero, out)
    _compute_grad_norm(zero, stage, out)
    if zero_data.get("overlap_comm") == (stage == 3):
        del zero_data["overlap_comm"]  # DeepSpeed's own rule, which the spec's default keeps
    zero.expect("reduce_scatter", True)
    zero.expect("allgather_partitions", True)
    zero.finish()


MULTI_RANK = "use_multi_rank_bucket_allreduce"
GRAD_NORM = "compute_grad_norm"


def _compute_grad_norm(zero: ConfigReader, stage: Any, out: _Build) -> None:
    """The spec's default skips the norm wherever DeepSpeed can (stage 1 or 2); other stages
    always compute it, as the spec's null says too."""
    _true_unless_set(
        zero,
        GRAD_NORM,
        out,
        field=GRAD_NORM,
        why_not_ours="the toolkit's own default skips the norm wherever DeepSpeed can; with it, "
        "an fp32 ZeRO-1/2 step with inf or NaN gradients is skipped",
        applies=stage in (1, 2),
    )


def _multi_rank_bucket_allreduce(zero: ConfigReader, out: _Build) -> None:
    """The spec's default reduces each gradient partition to its owner instead."""
    _true_unless_set(
        zero,
        MULTI_RANK,
        out,
        field="multi_rank_bucket_allreduce",
        why_not_ours="the toolkit's own default, false, reduces each gradient partition to its "
        "owner, moving each gradient once",
    )


def _true_unless_set(
    zero: ConfigReader,
    key: str,
    out: _Build,
    *,
    field: str,
    why_not_ours: str,
    applies: bool = True,
) -> None:
    """DeepSpeed's `key` as the config has it, and DeepSpeed's default (true) where the config
    leaves it out and the key `applies`: the spec field `zero.<field>` defaults otherwise, so
    writing nothing would change how the imported job runs."""
    if zero.has(key):
        out.put(f"zero.{field}", zero.at(key), zero.get(key))
    elif applies:
        out.put(f"zero.{field}", zero.at(key), True)
        zero.out.note(
            f"zero_optimization.{key} is missing: DeepSpeed's default is true; wrote true "
            f"({why_not_ours})"
        )


_SCALING = (
    "loss_scale",
    "initial_scale_power",
    "loss_scale_window",
    "hysteresis",
    "consecutive_hysteresis",
    "min_loss_scale",
)


def _precision(ds: ConfigReader, out: _Build) -> None:
    fp16 = ds.sub("fp16")
    bf16 = ds.sub("bf16") if ds.has("bf16") else ds.sub("bfloat16")
    ds.used.update(("bf16", "bfloat16"))
    fp16_on, bf16_on = fp16.get("enabled", False), bf16.get("enabled", False)
    for reader, value in ((fp16, fp16_on), (bf16, bf16_on)):
        if not isinstance(value, bool):
            ds.out.error(
                reader.at("enabled"), value, "must be true or false", "write true or false"
            )
    bf16.finish()
    precision = "fp16" if fp16_on is True else "bf16" if bf16_on is True else "fp32"
    out.put("precision", fp16.at("enabled") if fp16_on is True else bf16.at("enabled"), precision)
    for name in _SCALING:
        if fp16.has(name):
            whole = name not in ("loss_scale", "consecutive_hysteresis")
            value = fp16.get(name)
            out.put(f"loss_scaling.{name}", fp16.at(name), _whole(value) if whole else value)
    if fp16.has("auto_cast"):
        out.put("deepspeed.auto_cast", fp16.at("auto_cast"), fp16.get("auto_cast"))
    fp16.finish()


def _pipeline(ds: ConfigReader, out: _Build) -> None:
    if not ds.has("pipeline"):
        return
    pipe = ds.sub("pipeline")
    names = {"stages": "parallel.pipeline"}
    names |= {"activation_checkpoint_interval": "pipeline.activation_checkpoint_interval"}
    _copy(out, pipe, names, whole=True)
    if pipe.has("partition"):
        out.put("pipeline.partition", pipe.at("partition"), pipe.get("partition"))
    for key, value in (("seed_layers", False), ("pipe_partitioned", True)):
        pipe.expect(key, value)
    pipe.expect("grad_partitioned", True)
    pipe.finish()


def _put_dtype(out: _Build, report: Report, spec_path: str, where: str, value: Any) -> None:
    """DeepSpeed's dtype spellings (fp32, float32, ...) as the spec's; a misspelt one is
    refused with the dtype of its family as the hint ("bfp16": bf16)."""
    if isinstance(value, str) and value not in DTYPES:
        nearest = keys.nearest_dtype(value)
        allowed = "one of fp32, fp16, bf16 (or float32, float16, half, bfloat16)"
        report.error(where, value, allowed, f"did you mean {nearest!r}?")
        return
    out.put(spec_path, where, DTYPES.get(value, value) if isinstance(value, str) else value)


def _deepspeed_keys(ds: ConfigReader, out: _Build) -> None:
    """Top-level keys the spec's `deepspeed` section models, under DeepSpeed's names."""
    for key in (
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "prescale_gradients",
        "gradient_predivide_factor",
    ):
        if ds.has(key):
            out.put(f"deepspeed.{key}", ds.at(key), ds.get(key))
    if ds.has("communication_data_type") and ds.data["communication_data_type"] is not None:
        value = ds.get("communication_data_type")
        where = ds.at("communication_data_type")
        _put_dtype(out, ds.out, "deepspeed.communication_data_type", where, value)
    ds.used.add("communication_data_type")
    types = ds.sub("data_types")
    accum = types.get("grad_accum_dtype")
    if accum is not None:
        where = types.at("grad_accum_dtype")
        _put_dtype(out, ds.out, "deepspeed.grad_accum_dtype", where, accum)
    types.finish()
    ds.expect("gradient_allreduce_op", "mean", "every engine averages gradients (mean)")


def _activation_checkpointing(ds: ConfigReader, out: _Build) -> None:
    """DeepSpeed's checkpointing options; which modules recompute is the script's own choice
    in a DeepSpeed job (it calls deepspeed.checkpointing.checkpoint), so none is named."""
    section = ds.sub("activation_checkpointing")
    names = {
        key: f"activation_checkpointing.{key}"
        for key in ("partition_activations", "cpu_checkpointing")
    }
    _copy(out, section, names, whole=False)
    section.finish()


def _observability(ds: ConfigReader, out: _Build) -> None:
    """Logging, monitor and profiler keys, carried as written (they change no math)."""
    for key in sorted(OBSERVABILITY):
        if ds.has(key):
            out.put(f"deepspeed.observability.{key}", ds.at(key), ds.get(key))


def _prune_defaults(data: dict[str, Any]) -> None:
    """Drop `deepspeed` keys that hold what the spec renders anyway, so the written spec holds
    only what differs (the rendered config is the same either way)."""
    section = data.pop(DEEPSPEED_SECTION, {})
    precision = data.get("precision")
    zero_stage = data.get("zero", {}).get("stage")
    untested = data.get("optimizer", {}).get("name") == "sgd" and zero_stage not in (0, None)
    defaults = {
        "zero_allow_untested_optimizer": untested,
        "zero_force_ds_cpu_optimizer": True,
        "prescale_gradients": False,
        "gradient_predivide_factor": 1.0,
        "auto_cast": False,
        "grad_accum_dtype": precision,
        "communication_data_type": precision,
    }
    for key, value in defaults.items():
        if key in section and type(section[key]) is type(value) and section[key] == value:
            del section[key]
    if section:
        data[DEEPSPEED_SECTION] = section


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


def _batch(ds: ConfigReader, out: _Build) -> None:
    names = {
        "train_batch_size": "batch.global",
        "train_micro_batch_size_per_gpu": "batch.micro",
        "gradient_accumulation_steps": "batch.accumulation",
    }
    out.data["batch"] = {}
    _copy(out, ds, names, whole=True)


def spec_from_deepspeed(
    config: Any, *, world_size: int | None = None, lossy: bool = False
) -> Imported:
    """Import a DeepSpeed config dict. ToolkitError (a SpecError naming config keys) when it
    holds "auto" values, what the spec cannot express, or (unless `lossy`) keys it would drop."""
    autos = list(auto_paths(config))
    if autos:
        raise AutoValuesError(autos)
    report = Report()
    ds = ConfigReader(config, "", report)
    out = _Build()
    _batch(ds, out)
    fused_adam = _optimizer(ds, out, report)
    _scheduler(ds, out, report)
    clip = ds.get("gradient_clipping")
    if clip is None:
        report.note("gradient_clipping is missing: DeepSpeed clips at 1.0 by default; wrote 1.0")
        clip = 1.0
    out.put("clip_grad_norm", ds.at("gradient_clipping"), clip)
    _precision(ds, out)
    _zero(ds, out)
    if fused_adam and out.data["zero"]["offload_optimizer"] in ("none", None):
        report.note(fused_adam)
    _pipeline(ds, out)
    _deepspeed_keys(ds, out)
    _activation_checkpointing(ds, out)
    _observability(ds, out)
    if ds.has("steps_per_print"):
        out.put("log_every_steps", ds.at("steps_per_print"), _whole(ds.get("steps_per_print")))
    stages = out.data.get("parallel", {}).get("pipeline", 1)
    np = world_size if world_size is not None else _infer_world_size(out.data["batch"], stages)
    if np is not None:
        out.put("launch.np", "train_batch_size", np)
    ds.finish()
    _prune_defaults(out.data)
    issues = report.errors + ([] if lossy else report.strict_issues())
    if issues:
        raise DeepSpeedConfigError(issues)
    try:
        spec = TrainSpec.from_dict(out.data)
    except SpecError as error:
        issues = [out.ds_issue(issue) for issue in error.issues]
        raise DeepSpeedConfigError(issues, more=error.more) from None
    return Imported(
        data=out.data,
        spec=spec,
        warnings=report.notes,
        dropped=report.dropped,
        left_out=report.left_out,
    )
