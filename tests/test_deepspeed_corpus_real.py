"""Real DeepSpeed configs, copied from public repositories (tests/deepspeed_corpus/real/, each
named with its repository, path, commit and license in SOURCES.md).

Each is imported strictly after its "auto" values are filled as the Hugging Face Trainer would.
It is accepted, or refused only for the keys listed here, and each of those is math the toolkit
does not model, justified in docs/deepspeed-configs.md. Accepted or imported with --lossy,
the config is rendered back by `toolkit config deepspeed`, and DeepSpeed's own parser (the
oracle) reads the same effective math from it as from the original.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.deepspeed_oracle import deepspeed_parse
from toolkit.render.deepspeed import deepspeed_config
from toolkit.render.deepspeed_import import spec_from_deepspeed
from toolkit.render.deepspeed_input import auto_paths
from toolkit.spec import SpecError

REAL = Path(__file__).resolve().parent / "deepspeed_corpus" / "real"
JUSTIFIED = Path(__file__).resolve().parent.parent / "docs" / "deepspeed-configs.md"

FILLED = {
    "lr": 1e-4,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "weight_decay": 0.0,
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "warmup_min_lr": 0.0,
    "warmup_max_lr": 1e-4,
    "warmup_num_steps": 10,
    "total_num_steps": 100,
    "reduce_bucket_size": 4194304,
    "stage3_prefetch_bucket_size": 3774873,
    "stage3_param_persistence_threshold": 20480,
    "stage3_gather_16bit_weights_on_model_save": True,
}
"""What the Hugging Face Trainer writes for each "auto" key (its TrainingArguments' values for
a 2-rank job; bf16 on, fp16 off)."""

REFUSED: dict[str, tuple[str, ...]] = {
    "tests_model_bingbertsquad_deepspeed_bsz24_fp16_eigenvalue_quantize_config": (
        "eigenvalue",
        "quantize_training",
    ),
    "tests_torch_compile_ds_config_z3_deepcompile_no_persist": ("compile",),
    "examples_alst_ulysses_sequence_parallelism_sp-alst.ds-config": (
        "seq_parallel_communication_data_type",
    ),
    "examples_deepspeed_ds_z2_autotp_config": ("tensor_parallel",),
    "compression_bert_config_ds_config_w1a8_qgroup64_fp16": ("compression_training",),
    "compression_cifar_config_ds_config_channel_prune": ("compression_training",),
    "megatron-lm-v1.1.5-zero3_examples_ds_zero_stage_3_config": (
        "zero_optimization.stage3_param_persitance_threshold",
    ),
    "megatron-lm-v1.1.5-zero3_examples_ds_zero_stage_infinity_config": (
        "zero_optimization.stage3_param_persitence_threshold",
    ),
    "megatron-lm_scripts_ds_zerodual_config": ("optimizer",),
    "qanet-pytorch_ds_bsz512_1cycle": ("scheduler",),
    "training_bing_bert_01_adam_nccl_deepspeed_bsz4k_01adam_config_seq128_nccl": ("optimizer",),
    "training_bing_bert_1-bit_adam_nccl_deepspeed_bsz4k_onebitadam_config_seq128_nccl": (
        "optimizer",
    ),
    "training_bing_bert_1-bit_lamb_nccl_deepspeed_bsz64k_onebitlamb_config_seq128_nccl": (
        "optimizer",
    ),
    "training_bing_bert_deepspeed_bsz4k_progressive_layer_drop_config_seq128": (
        "progressive_layer_drop",
    ),
    "training_bing_bert_deepspeed_bsz64k_lamb_config_seq128": (
        "optimizer",
        "sparse_attention",
    ),
    "training_data_efficiency_gpt_finetuning_config_ds_config_gpt_base_random_ltd": (
        "data_efficiency",
    ),
    "training_moq_test": ("quantize_training",),
    "ds_zero2_config_bf16": (
        "communication_data_type",
        "bfloat16.loss_scale",
    ),
    "examples_deepspeed_curriculum_learning_ds_zero_stage_1_config_baseline": (
        "optimizer.params.max_grad_norm",
    ),
}
"""Per config (its path in its repository, as in its file name after owner__repo__), the keys a
strict import refuses; every other config imports strictly."""

ADAM_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}
"""DeepSpeed's Adam/AdamW hyperparameters where a config leaves them out."""

NAMES = sorted(path.stem for path in REAL.glob("*.json"))


def refused_by(name: str) -> tuple[str, ...]:
    return REFUSED.get(name.split("__", 2)[2], ())


def filled(name: str) -> dict[str, Any]:
    config = json.loads((REAL / f"{name}.json").read_text())
    for path in list(auto_paths(config)):
        *parents, key = path.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[key] = parents[0] == "bf16" if key == "enabled" else FILLED[key]
    return config


def test_the_corpus_is_30_real_configs_each_with_its_source() -> None:
    sources = (REAL / "SOURCES.md").read_text()
    assert len(NAMES) >= 30
    for name in NAMES:
        row = next((line for line in sources.splitlines() if f"| {name}.json |" in line), "")
        assert re.search(r"\| [0-9a-f]{40} \|", row), f"{name}: no source row with a commit"
    assert set(REFUSED) <= {name.split("__", 2)[2] for name in NAMES}


def test_every_refusal_is_justified_in_the_docs() -> None:
    page = JUSTIFIED.read_text()
    for key in sorted({key for keys in REFUSED.values() for key in keys}):
        assert f"`{key}`" in page, f"{key} is refused but docs/deepspeed-configs.md says not why"


@pytest.mark.parametrize("name", NAMES)
def test_a_strict_import_refuses_only_math_the_toolkit_does_not_model(name: str) -> None:
    expected = refused_by(name)
    if not expected:
        spec_from_deepspeed(filled(name))
        return
    with pytest.raises(SpecError) as caught:
        spec_from_deepspeed(filled(name))
    assert [issue.path for issue in caught.value.issues] == list(expected)


def world_of(config: dict[str, Any]) -> int:
    """The ranks a config was written for: from its batch when it gives global and micro
    batch (and accumulation, default 1), else 2."""
    batch, micro = config.get("train_batch_size"), config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps", 1)
    if isinstance(batch, int) and isinstance(micro, int) and isinstance(accumulation, int):
        return max(1, batch // (micro * accumulation))
    return 2


def effective(parsed: Any) -> dict[str, Any]:
    """The math DeepSpeed reads from a parsed config: batch, clipping, precision and loss
    scaling, ZeRO stage and offload, the optimizer's update rule and hyperparameters."""
    params = dict(parsed.optimizer_params or {})
    name = parsed.optimizer_name
    if name == "adam" and params.get("adam_w_mode", True):
        name = "adamw"  # DeepSpeed runs type Adam as AdamW unless adam_w_mode is false
    fp16 = parsed.float16_config
    return {
        "batch": (
            parsed.train_batch_size,
            parsed.train_micro_batch_size_per_gpu,
            parsed.gradient_accumulation_steps,
        ),
        "clip": parsed.gradient_clipping,
        "precision": (fp16.enabled, parsed.bfloat16_config.enabled),
        "loss_scaling": (
            fp16.loss_scale,
            fp16.initial_scale_power,
            fp16.loss_scale_window,
            fp16.hysteresis,
            fp16.min_loss_scale,
        )
        if fp16.enabled
        else None,
        "zero_stage": parsed.zero_optimization_stage,
        "offload": (
            getattr(parsed.zero_config.offload_optimizer, "device", "none"),
            getattr(parsed.zero_config.offload_param, "device", "none")
            if parsed.zero_optimization_stage == 3
            else "none",
        ),
        "optimizer": name,
        "hyperparameters": {
            key: list(params.get(key, default)) if key == "betas" else params.get(key, default)
            for key, default in ADAM_DEFAULTS.items()
        }
        if name in ("adam", "adamw")
        else {"lr": params.get("lr")}
        if name
        else None,
        "weight_decay": params.get("weight_decay", 0.0) if name else None,
        "division": (parsed.prescale_gradients, parsed.gradient_predivide_factor),
        "recompute": (
            parsed.activation_checkpointing_config.partition_activations,
            parsed.activation_checkpointing_config.cpu_checkpointing,
        ),
        # Unset, DeepSpeed reduces in the training precision's dtype (its engine's rule).
        "communication": parsed.communication_data_type
        or {(True, False): torch.float16, (False, True): torch.bfloat16}.get(
            (fp16.enabled, parsed.bfloat16_config.enabled), torch.float32
        ),
    }


def without(config: dict[str, Any], refused: tuple[str, ...]) -> dict[str, Any]:
    """The config without its refused keys (and, without its optimizer, its scheduler)."""
    kept = {key: value for key, value in config.items() if key not in refused}
    if "optimizer" in refused:
        kept.pop("scheduler", None)
    for key in [key for key in refused if "." in key]:
        section, _, inner = key.partition(".")
        if "." not in inner:
            kept[section] = {k: v for k, v in kept[section].items() if k != inner}
        else:  # optimizer.params.<key>
            part, _, leaf = inner.partition(".")
            inner_section = {k: v for k, v in kept[section][part].items() if k != leaf}
            kept[section] = {**kept[section], part: inner_section}
    return kept


@pytest.mark.parametrize("name", NAMES)
def test_the_rendered_config_gives_deepspeed_the_same_math(name: str) -> None:
    """Without its refused keys, the config imports strictly, and DeepSpeed reads the same
    math from the rendered config as from it."""
    kept = without(filled(name), refused_by(name))
    world = world_of(kept)
    imported = spec_from_deepspeed(kept, world_size=world)
    rendered = deepspeed_config(imported.spec, world)
    if not {"train_batch_size", "train_micro_batch_size_per_gpu"} & set(kept):
        kept["train_micro_batch_size_per_gpu"] = rendered["train_micro_batch_size_per_gpu"]
    assert effective(deepspeed_parse(rendered, world)) == effective(deepspeed_parse(kept, world))
