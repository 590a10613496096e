"""`spec from-deepspeed`: importing a DeepSpeed config keeps every setting the spec models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolkit.render.deepspeed import deepspeed_config
from toolkit.render.deepspeed_import import spec_from_deepspeed
from toolkit.spec import SpecError, TrainSpec, load_spec

PRESETS = Path(__file__).resolve().parents[1] / "ds_configs" / "specs"

SPECS: list[dict[str, Any]] = [
    {"backend": "deepspeed", "batch": {"global": 64, "micro": 4}, "launch": {"np": 8}},
    {
        "backend": "deepspeed",
        "batch": {"micro": 2, "accumulation": 3},
        "optimizer": {"name": "adam", "lr": 0.01, "betas": [0.8, 0.9], "eps": 1e-6},
        "clip_grad_norm": 0.25,
        "precision": "fp16",
        "loss_scaling": {"loss_scale": 0.0, "initial_scale_power": 12, "hysteresis": 4},
        "zero": {
            "stage": 3,
            "offload_params": "nvme",
            "nvme_path": "/nvme",
            "pin_memory": False,
            "stage3_max_live_parameters": 1000,
            "overlap_comm": False,
        },
        "launch": {"np": 4},
        "log_every_steps": 7,
    },
    {
        "backend": "deepspeed",
        "optimizer": {
            "name": "sgd",
            "lr": 0.5,
            "momentum": 0.9,
            "nesterov": True,
            "weight_decay": 1e-4,
        },
        "zero": {"stage": 1},
        "pipeline": {"stages": 2, "partition": "uniform", "activation_checkpoint_interval": 2},
        "precision": "bf16",
        "launch": {"np": 4},
    },
]


def all_specs() -> list[TrainSpec]:
    specs = [TrainSpec.from_dict(data) for data in SPECS]
    return specs + [load_spec(path) for path in sorted(PRESETS.glob("*.yaml"))]


@pytest.mark.parametrize("spec", all_specs())
def test_round_trip_keeps_every_modeled_setting(spec: TrainSpec) -> None:
    config = deepspeed_config(spec)
    imported = spec_from_deepspeed(config)
    assert imported.warnings == []
    again = imported.spec
    assert deepspeed_config(again) == config
    assert again.world_size == spec.world_size
    assert again.batch_for() == spec.batch_for()
    for section in ("optimizer", "zero", "pipeline"):
        assert getattr(again, section) == getattr(spec, section), section
    assert (again.precision, again.clip_grad_norm, again.log_every_steps) == (
        spec.precision,
        spec.clip_grad_norm,
        spec.log_every_steps,
    )
    if spec.precision == "fp16":
        assert again.loss_scaling == spec.loss_scaling


def test_auto_and_unmodeled_keys_are_named() -> None:
    imported = spec_from_deepspeed(
        {
            "train_micro_batch_size_per_gpu": 8,
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
            "scheduler": {"type": "WarmupLR", "params": {}},
            "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "sub_group_size": 1},
            "tensorboard": {"enabled": True},
        },
        world_size=4,
    )
    text = "\n".join(imported.warnings)
    for name in (
        "deepspeed.scheduler",
        "deepspeed.tensorboard",
        "deepspeed.zero_optimization.reduce_bucket_size: 'auto'",
        "deepspeed.zero_optimization.sub_group_size",
        "gradient_clipping is missing",
        "Adam without adam_w_mode",
    ):
        assert name in text
    spec = imported.spec
    assert spec.clip_grad_norm == 1.0  # what DeepSpeed does when the key is missing
    assert spec.optimizer.name == "adamw"  # what DeepSpeed runs for type Adam by default
    assert spec.world_size == 4
    assert spec.batch_for().global_ == 32


def test_what_the_spec_cannot_express_is_an_error() -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_deepspeed(
            {
                "train_batch_size": "auto",
                "optimizer": {"type": "Lamb", "params": {"lr": "auto"}},
                "gradient_allreduce_op": "sum",
                "fp16": {"enabled": "auto"},
            }
        )
    paths = [issue.path for issue in caught.value.issues]
    assert paths == [
        "deepspeed.optimizer.params.lr",
        "deepspeed.optimizer.type",
        "deepspeed.fp16.enabled",
        "deepspeed.train_batch_size",
        "deepspeed.gradient_allreduce_op",
    ]


def test_imported_values_are_still_validated() -> None:
    with pytest.raises(SpecError, match=r"zero\.offload_params"):
        spec_from_deepspeed(
            {
                "train_micro_batch_size_per_gpu": 1,
                "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
            }
        )


def test_json_whole_number_floats_are_integers() -> None:
    imported = spec_from_deepspeed(
        {
            "train_batch_size": 16.0,
            "train_micro_batch_size_per_gpu": 2,
            "gradient_clipping": 1.0,
            "zero_optimization": {
                "stage": 2,
                "reduce_bucket_size": 5e8,
                "allgather_bucket_size": 2e8,
            },
        },
        world_size=8,
    )
    assert imported.spec.zero.reduce_bucket_size == 500_000_000
    assert imported.spec.zero.allgather_bucket_size == 200_000_000
    assert imported.spec.batch_for().global_ == 16


@pytest.mark.parametrize(
    "config",
    [
        {"zero_optimization": {"offload_optimizer": {"pin_memory": []}}},
        {"zero_optimization": {"offload_optimizer": {"pin_memory": {}}, "offload_param": {}}},
        {"optimizer": {"type": 10**5000, "params": {"lr": 0.1}}},
        [1, 2],
    ],
)
def test_odd_configs_end_in_a_spec_error(config: object) -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_deepspeed(config)
    assert all(issue.hint for issue in caught.value.issues)
    assert "\n" not in caught.value.one_line() and len(caught.value.one_line()) < 8000


def test_warnings_show_huge_values_shortened() -> None:
    imported = spec_from_deepspeed(
        {
            "train_micro_batch_size_per_gpu": 1,
            "prescale_gradients": [1] * 10**5,
            "communication_data_type": "x" * 10**6,
        }
    )
    assert len(imported.warnings) >= 2
    assert all(len(message) < 300 for message in imported.warnings)
