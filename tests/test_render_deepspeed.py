"""Generated DeepSpeed configs, validated by DeepSpeed's own config classes (the oracle)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.deepspeed_oracle import deepspeed_parse
from toolkit.render.deepspeed import deepspeed_config
from toolkit.spec import TrainSpec, load_spec
from toolkit.units import MIB

deepspeed = pytest.importorskip("deepspeed")
ds_config = pytest.importorskip("deepspeed.runtime.config")

PRESETS = Path(__file__).resolve().parents[1] / "ds_configs"
WORLD_SIZES = (1, 2, 8)

MATRIX: list[dict[str, Any]] = [
    {"zero": {"stage": stage}, "precision": precision}
    for stage in (0, 1, 2, 3)
    for precision in ("fp32", "fp16", "bf16")
] + [
    {
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True},
        "zero": {"stage": 2},
    },
    {"optimizer": {"name": "adam", "weight_decay": 0.1}, "clip_grad_norm": 0.5},
    {
        "zero": {
            "stage": 3,
            "offload_optimizer": "nvme",
            "offload_params": "nvme",
            "nvme_path": "/x",
        }
    },
    {"zero": {"stage": 1, "offload_optimizer": "cpu", "pin_memory": False}},
    {"zero": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 1000}},
    {
        "parallel": {"pipeline": 2},
        "pipeline": {"activation_checkpoint_interval": 1},
        "zero": {"stage": 1},
        "launch": {"np": 2},
    },
    {"lr_scaling": "linear", "precision": "fp16", "loss_scaling": {"loss_scale": 128.0}},
    {"optimizer": {"name": "adam", "bias_correction": False}, "zero": {"stage": 1}},
    {"optimizer": {"name": "script"}, "zero": {"stage": 2}},
    {
        "precision": "fp16",
        "deepspeed": {
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "prescale_gradients": True,
            "gradient_predivide_factor": 2.0,
            "auto_cast": True,
            "grad_accum_dtype": "fp32",
            "communication_data_type": "fp32",
        },
    },
]


def spec_of(extra: dict[str, Any]) -> TrainSpec:
    data = {"backend": "deepspeed", "batch": {"micro": 4, "accumulation": 2}, **extra}
    return TrainSpec.from_dict(data)


def validated(spec: TrainSpec, world: int) -> tuple[dict[str, Any], Any]:
    config = deepspeed_config(spec, world)
    dp = world // spec.parallel.pipeline
    parsed = deepspeed_parse(config, dp)
    return config, parsed


def cases() -> list[tuple[str, TrainSpec]]:
    found = [(f"matrix{index}", spec_of(extra)) for index, extra in enumerate(MATRIX)]
    found += [(path.stem, load_spec(path)) for path in sorted(PRESETS.glob("specs/*.yaml"))]
    return found


def valid_pairs() -> list[tuple[str, TrainSpec, int]]:
    """Every case at every world size its pipeline stages divide (others cannot run at all)."""
    return [
        (name, spec, world)
        for name, spec in cases()
        for world in WORLD_SIZES
        if world % spec.parallel.pipeline == 0
    ]


@pytest.mark.parametrize(
    ("name", "spec", "world"), valid_pairs(), ids=[f"{n}-world{w}" for n, _, w in valid_pairs()]
)
def test_deepspeed_accepts_the_config(name: str, spec: TrainSpec, world: int) -> None:
    _, parsed = validated(spec, world)
    batch = spec.batch_for(world)
    assert parsed.world_size == batch.dp
    # DeepSpeed's own batch check passed; the triple it kept is ours, not one it derived.
    assert (
        parsed.train_batch_size,
        parsed.train_micro_batch_size_per_gpu,
        parsed.gradient_accumulation_steps,
    ) == (batch.global_, batch.micro, batch.accumulation)
    assert parsed.train_batch_size == batch.micro * batch.accumulation * parsed.world_size
    assert parsed.gradient_clipping == spec.clip_grad_norm
    assert parsed.zero_optimization_stage == spec.zero.stage
    assert parsed.zero_config.offload_optimizer.device == spec.zero.offload_optimizer
    assert parsed.zero_config.offload_param.device == spec.zero.offload_params
    assert parsed.float16_config.enabled == (spec.precision == "fp16")
    assert parsed.bfloat16_config.enabled == (spec.precision == "bf16")
    if spec.optimizer.name == "script":
        assert parsed.optimizer_name is None  # the script passes its own
    else:
        assert parsed.optimizer_params["lr"] == pytest.approx(spec.effective_lr(world))
    assert parsed.gradient_allreduce_op == "mean"
    ds = spec.deepspeed
    assert parsed.prescale_gradients == ds.prescale_gradients
    assert parsed.gradient_predivide_factor == ds.gradient_predivide_factor
    assert parsed.float16_config.auto_cast == (spec.precision == "fp16" and ds.auto_cast)
    assert parsed.zero_force_ds_cpu_optimizer == ds.zero_force_ds_cpu_optimizer


def test_no_auto_and_no_unknown_top_level_keys() -> None:
    import deepspeed.runtime.activation_checkpointing.config as checkpointing
    import deepspeed.runtime.constants as constants
    import deepspeed.runtime.precision_config as precision
    import deepspeed.runtime.zero.config as zero

    known = {"pipeline"}  # read by name in deepspeed.runtime.config.get_pipeline_config
    for module in (constants, zero, precision, checkpointing):
        known |= {v for k, v in vars(module).items() if k.isupper() and isinstance(v, str)}
    for _, spec in cases():
        config = deepspeed_config(spec, spec.parallel.pipeline * 2)
        assert set(config) <= known
        assert '"auto"' not in json.dumps(config)  # no value left for DeepSpeed to pick


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_adam_mode_is_explicit(name: str) -> None:
    """DeepSpeed runs type Adam as AdamW unless adam_w_mode is false: always write the flag."""
    params = deepspeed_config(spec_of({"optimizer": {"name": name}}), 2)["optimizer"]["params"]
    assert params["adam_w_mode"] is (name == "adamw")
    assert params["torch_adam"] is True


def test_adam_without_bias_correction_runs_deepspeeds_adam() -> None:
    """torch.optim.Adam always corrects bias and takes no such argument: DeepSpeed's own."""
    spec = spec_of({"optimizer": {"name": "adam", "bias_correction": False}})
    params = deepspeed_config(spec, 2)["optimizer"]["params"]
    assert (params["torch_adam"], params["bias_correction"]) == (False, False)


def test_clipping_is_written_even_when_off() -> None:
    """DeepSpeed's default gradient_clipping is 1.0, so 0 (off) must be written out."""
    assert ds_config.GRADIENT_CLIPPING_DEFAULT == 1.0
    assert deepspeed_config(spec_of({}), 1)["gradient_clipping"] == 0.0


def test_reduce_bucket_is_the_toolkits_16_mib_not_deepspeeds_2_gb() -> None:
    """ZeRO-1/2 allocate the whole reduce bucket every backward. DeepSpeed's own size maps 2 GB
    afresh each step on a CPU under glibc's own settings; the toolkit's is 16 MiB in fp32 (the
    widest dtype DeepSpeed reduces in), which DeepSpeed's parser takes as written."""
    zero_config = pytest.importorskip("deepspeed.runtime.zero.config")
    assert zero_config.DeepSpeedZeroConfig().reduce_bucket_size == 500_000_000
    config, parsed = validated(spec_of({"zero": {"stage": 2}}), 2)
    bucket = config["zero_optimization"]["reduce_bucket_size"]
    assert parsed.zero_config.reduce_bucket_size == bucket
    assert bucket * 4 == 16 * MIB


@pytest.mark.parametrize(
    ("extra", "computed"),
    [
        ({"zero": {"stage": 1}}, False),
        ({"zero": {"stage": 2}}, False),
        ({"zero": {"stage": 2}, "clip_grad_norm": 1.0}, True),
        ({"zero": {"stage": 2, "offload_optimizer": "cpu"}}, True),
        ({"zero": {"stage": 0}}, True),
        ({"zero": {"stage": 3}}, True),
        ({"zero": {"stage": 2, "compute_grad_norm": True}}, True),
        (
            {"zero": {"stage": 1}, "precision": "bf16", "deepspeed": {"grad_accum_dtype": "fp32"}},
            True,
        ),
        (
            {"zero": {"stage": 2}, "precision": "bf16", "deepspeed": {"grad_accum_dtype": "fp32"}},
            False,
        ),
    ],
)
def test_the_gradient_norm_is_skipped_wherever_deepspeed_can(
    extra: dict[str, Any], computed: bool
) -> None:
    """Written out either way, and DeepSpeed's own config accepts it."""
    config, parsed = validated(spec_of(extra), 2)
    assert config["zero_optimization"]["compute_grad_norm"] is computed
    assert parsed.zero_config.compute_grad_norm is computed


def test_cpu_offload_uses_deepspeed_cpu_adam() -> None:
    spec = spec_of({"zero": {"stage": 2, "offload_optimizer": "cpu"}})
    config = deepspeed_config(spec, 2)
    assert config["optimizer"]["params"]["torch_adam"] is False
    assert config["zero_force_ds_cpu_optimizer"] is True


def test_sgd_under_zero_is_allowed_explicitly() -> None:
    spec = spec_of({"optimizer": {"name": "sgd", "momentum": 0.9}, "zero": {"stage": 1}})
    config, parsed = validated(spec, 2)
    assert config["optimizer"]["type"] == "SGD"  # torch.optim.SGD, looked up by this name
    assert parsed.zero_allow_untested_optimizer is True
