"""`spec from-deepspeed`: importing a DeepSpeed config keeps every setting the spec models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolkit.errors import ToolkitError
from toolkit.render.deepspeed import deepspeed_config
from toolkit.render.deepspeed_import import spec_from_deepspeed
from toolkit.render.deepspeed_input import apply_settings
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
        "parallel": {"pipeline": 2},
        "pipeline": {"partition": "uniform", "activation_checkpoint_interval": 2},
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
    for section in ("optimizer", "pipeline"):
        assert getattr(again, section) == getattr(spec, section), section
    # The config holds the norm's resolved value, which the import writes out explicitly.
    assert again.computes_grad_norm == spec.computes_grad_norm
    unresolved = again.zero.model_copy(update={"compute_grad_norm": spec.zero.compute_grad_norm})
    assert unresolved == spec.zero
    assert (again.precision, again.clip_grad_norm, again.log_every_steps) == (
        spec.precision,
        spec.clip_grad_norm,
        spec.log_every_steps,
    )
    if spec.precision == "fp16":
        assert again.loss_scaling == spec.loss_scaling


def test_defaults_written_out_are_noted() -> None:
    imported = spec_from_deepspeed(
        {
            "train_micro_batch_size_per_gpu": 8,
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
        },
        world_size=4,
    )
    text = "\n".join(imported.warnings)
    assert "gradient_clipping is missing" in text and "Adam without adam_w_mode" in text
    assert "reduce_bucket_size is missing" in text
    assert "use_multi_rank_bucket_allreduce is missing" in text
    spec = imported.spec
    assert spec.clip_grad_norm == 1.0  # what DeepSpeed does when the key is missing
    assert spec.zero.reduce_bucket_size == 500_000_000  # DeepSpeed's, not the spec's default
    assert spec.zero.multi_rank_bucket_allreduce is True  # DeepSpeed's, not the spec's default
    assert spec.optimizer.name == "adamw"  # what DeepSpeed runs for type Adam by default
    assert spec.world_size == 4
    assert spec.batch_for().global_ == 32


def test_a_configs_own_multi_rank_bucket_allreduce_is_kept_without_a_note() -> None:
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "zero_optimization": {"stage": 2, "use_multi_rank_bucket_allreduce": False},
    }
    imported = spec_from_deepspeed(config, world_size=2)
    assert imported.spec.zero.multi_rank_bucket_allreduce is False
    assert not any("use_multi_rank_bucket_allreduce" in note for note in imported.warnings)
    refused = {**config, "zero_optimization": {"use_multi_rank_bucket_allreduce": "yes"}}
    with pytest.raises(ToolkitError, match=r"zero_optimization\.use_multi_rank_bucket_allreduce"):
        spec_from_deepspeed(refused, world_size=2)


def test_a_missing_compute_grad_norm_is_deepspeeds_true_at_stages_1_and_2() -> None:
    base = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.0}
    for stage in (1, 2):
        imported = spec_from_deepspeed(
            {**base, "zero_optimization": {"stage": stage}}, world_size=2
        )
        assert imported.spec.zero.compute_grad_norm is True
        assert imported.spec.computes_grad_norm is True
        assert any("compute_grad_norm is missing" in note for note in imported.warnings)
    # Stages 0 and 3 always compute it, and the spec's null says so without a note.
    imported = spec_from_deepspeed({**base, "zero_optimization": {"stage": 3}}, world_size=2)
    assert imported.spec.zero.compute_grad_norm is None
    assert imported.spec.computes_grad_norm is True
    assert not any("compute_grad_norm" in note for note in imported.warnings)


def test_a_configs_own_compute_grad_norm_is_kept_and_checked() -> None:
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "compute_grad_norm": False},
    }
    imported = spec_from_deepspeed(config, world_size=2)
    assert imported.spec.zero.compute_grad_norm is False
    assert not any("compute_grad_norm" in note for note in imported.warnings)
    clipped = {**config, "gradient_clipping": 1.0}
    with pytest.raises(ToolkitError, match=r"zero_optimization\.compute_grad_norm"):
        spec_from_deepspeed(clipped, world_size=2)


UNMODELLED = {
    "train_micro_batch_size_per_gpu": 8,
    "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2},
    "data_efficiency": {"enabled": True},
    "gradient_allreduce_op": "sum",
    "sparse_attention": {"mode": "fixed"},
}


def test_unmodelled_keys_are_refused_by_their_deepspeed_names() -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_deepspeed(UNMODELLED)
    found = {issue.path: issue for issue in caught.value.issues}
    assert list(found) == [
        "zero_optimization.zero_hpz_partition_size",
        "gradient_allreduce_op",
        "data_efficiency",
        "sparse_attention",
    ]
    assert "removed from DeepSpeed" in found["sparse_attention"].allowed
    assert all(
        issue.hint == "pass --lossy to import anyway and record it" for issue in found.values()
    )
    line = caught.value.one_line()
    assert line.startswith("deepspeed config: ") and "\n" not in line


def test_lossy_import_records_every_dropped_key_with_its_value() -> None:
    imported = spec_from_deepspeed(UNMODELLED, lossy=True)
    dropped = {item.path: item.value for item in imported.dropped}
    assert dropped == {
        "zero_optimization.zero_hpz_partition_size": 2,
        "gradient_allreduce_op": "sum",
        "data_efficiency": {"enabled": True},
        "sparse_attention": {"mode": "fixed"},
    }
    assert imported.spec.zero.stage == 2


def test_auto_values_are_listed_exactly() -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_deepspeed(
            {
                "train_batch_size": "auto",
                "optimizer": {"type": "AdamW", "params": {"lr": "auto", "eps": 1e-8}},
                "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
            }
        )
    assert [issue.path for issue in caught.value.issues] == [
        "train_batch_size",
        "optimizer.params.lr",
        "zero_optimization.reduce_bucket_size",
    ]
    assert caught.value.one_line().startswith(
        'deepspeed config: "auto" needs a value at train_batch_size, optimizer.params.lr, '
        "zero_optimization.reduce_bucket_size HINT: give each with --set KEY=VALUE"
    )


def test_settings_fill_auto_values() -> None:
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    }
    filled = apply_settings(
        config,
        ["train_micro_batch_size_per_gpu=8", "optimizer.params.lr=3e-5", "bf16.enabled=true"],
    )
    assert config["optimizer"]["params"]["lr"] == "auto"  # the caller's config is not changed
    spec = spec_from_deepspeed(filled, world_size=2).spec
    assert (spec.batch_for().micro, spec.optimizer.lr, spec.precision) == (8, 3e-5, "bf16")


@pytest.mark.parametrize("setting", ["lr", "=3", "a..b=1", "train_batch_size.x=1"])
def test_malformed_settings_are_one_line_errors(setting: str) -> None:
    with pytest.raises(ToolkitError) as caught:
        apply_settings({"train_batch_size": 8}, [setting])
    assert "--set" in caught.value.one_line() and caught.value.hint


def test_what_the_spec_cannot_express_is_an_error() -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_deepspeed(
            {
                "optimizer": {"type": "Lamb", "params": {"lr": 0.1}},
                "fp16": {"enabled": "yes"},
                "scheduler": {"type": "OneCycle", "params": {}},
            }
        )
    paths = [issue.path for issue in caught.value.issues]
    assert paths == ["fp16.enabled", "optimizer", "scheduler"]


def test_spec_refusals_name_the_deepspeed_key() -> None:
    with pytest.raises(SpecError) as caught:
        spec_from_deepspeed(
            {
                "train_micro_batch_size_per_gpu": 1,
                "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}},
            }
        )
    assert [issue.path for issue in caught.value.issues] == [
        "zero_optimization.offload_optimizer.device"
    ]


def test_offload_param_below_stage_3_is_what_deepspeed_does_with_it() -> None:
    imported = spec_from_deepspeed(
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
        }
    )
    assert imported.spec.zero.offload_params == "none"
    assert any("ignores it at stage 2" in note for note in imported.warnings)


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


def test_lossy_comments_show_huge_values_shortened() -> None:
    imported = spec_from_deepspeed(
        {
            "train_micro_batch_size_per_gpu": 1,
            "compile": [1] * 10**5,
            "data_efficiency": "x" * 10**6,
        },
        lossy=True,
    )
    comments = [item.comment() for item in imported.dropped]
    assert len(comments) == 2 and all(len(text) < 2200 for text in comments)


NO_MATH = {
    "train_micro_batch_size_per_gpu": 8,
    "fp16": {"enabled": True, "fp16_master_weights_and_grads": False},
    "zero_optimization": {
        "stage": 3,
        "stage3_gather_fp16_weights_on_model_save": True,
        "ignore_unused_parameters": True,
    },
    "tensorboard": {"enabled": True, "output_path": "runs/"},
    "wall_clock_breakdown": True,
    "hybrid_engine": {"enabled": False, "max_out_tokens": 512},
    "curriculum_learning": {"enabled": False},
    "cuda_visible_devices": "0,1",
}


def test_keys_that_change_no_math_are_carried_or_left_out_never_refused() -> None:
    imported = spec_from_deepspeed(NO_MATH)  # strict
    left_out = {item.path: item.reason for item in imported.left_out}
    assert list(left_out) == [
        "fp16.fp16_master_weights_and_grads",
        "zero_optimization.ignore_unused_parameters",
        "hybrid_engine",
        "curriculum_learning",
        "cuda_visible_devices",
    ]
    assert "refuses the key" in left_out["curriculum_learning"]
    rendered = deepspeed_config(imported.spec)
    assert rendered["tensorboard"] == NO_MATH["tensorboard"]
    assert rendered["wall_clock_breakdown"] is True
    # DeepSpeed's deprecated alias is read as the key it stands for, value kept.
    assert rendered["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert any("deprecated name" in note for note in imported.warnings)
    assert not {"hybrid_engine", "curriculum_learning", "cuda_visible_devices"} & set(rendered)


def test_a_default_written_out_is_left_out_and_any_other_value_refused() -> None:
    config = {"train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": True}}
    config["fp16"]["fp16_master_weights_and_grads"] = True
    with pytest.raises(SpecError, match=r"fp16\.fp16_master_weights_and_grads"):
        spec_from_deepspeed(config)


def test_substitutions_are_notes() -> None:
    imported = spec_from_deepspeed(
        {
            "train_micro_batch_size_per_gpu": 8,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}},
        }
    )
    notes = " | ".join(imported.warnings)
    assert "FusedAdam" in notes and "torch_adam: true" in notes
    assert "warmup_num_steps 0" in notes and "wrote 2" in notes
    assert imported.spec.schedule.warmup_steps == 2


def test_a_misspelt_dtype_is_refused_naming_its_family() -> None:
    config = {"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": True}}
    with pytest.raises(SpecError) as caught:
        spec_from_deepspeed({**config, "communication_data_type": "bfp16"})
    [issue] = caught.value.issues
    assert issue.path == "communication_data_type" and "'bf16'" in issue.hint


def test_observability_holds_only_logging_monitor_and_profiler_keys() -> None:
    with pytest.raises(SpecError, match=r"deepspeed\.observability"):
        TrainSpec.from_dict(
            {"backend": "deepspeed", "deepspeed": {"observability": {"zero_optimization": {}}}}
        )
