"""A corpus of DeepSpeed configs in the shapes real public ones take (written for this project,
not copied): BERT's Adam without bias correction, Megatron's guard flags and offload_param at
ZeRO stage 2, Hugging Face "auto" configs, fp16 loss scaling, bf16, schedulers, monitors.

Each is imported strictly (accepted, or refused naming exactly the keys it would drop) and with
--lossy (every dropped key listed in the written spec), rendered back by `toolkit config
deepspeed` and parsed by DeepSpeed's own `DeepSpeedConfig`, the oracle; every key that was not
dropped must come back with the value it had.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deepspeed_oracle import deepspeed_parse
from toolkit.cli import main
from toolkit.render.deepspeed import deepspeed_config
from toolkit.render.deepspeed_import import spec_from_deepspeed
from toolkit.render.deepspeed_input import REMOVED, apply_settings
from toolkit.spec import SpecError, TrainSpec, load_spec

ds_config = pytest.importorskip("deepspeed.runtime.config")

CORPUS = Path(__file__).resolve().parent / "deepspeed_corpus"
LOSSY_HINT = "pass --lossy to import anyway and record it"


@dataclass(frozen=True)
class Case:
    world: int
    """Ranks the config is for (given as --world-size, or inferred from its batch triple)."""
    given_world: bool = False
    settings: tuple[str, ...] = ()
    """--set values for its "auto" keys, as the Hugging Face Trainer would fill them."""
    refused: tuple[str, ...] = ()
    """Keys a strict import refuses (and a lossy one records)."""
    left_out: tuple[str, ...] = ()
    """Keys that change no math, left out with a note (toolkit.render.deepspeed_keys)."""
    changed: tuple[str, ...] = ()
    """Keys rendered back differently with the same meaning to DeepSpeed."""


HF_ZERO2 = (
    "fp16.enabled=false",
    "bf16.enabled=true",
    "optimizer.params.lr=3e-5",
    "optimizer.params.betas=[0.9, 0.999]",
    "optimizer.params.eps=1e-8",
    "optimizer.params.weight_decay=0.0",
    "zero_optimization.reduce_bucket_size=4194304",
    "gradient_accumulation_steps=2",
    "gradient_clipping=1.0",
    "train_batch_size=32",
    "train_micro_batch_size_per_gpu=8",
)
HF_ZERO3 = (
    *(s for s in HF_ZERO2 if not s.startswith("fp16")),
    "scheduler.params.warmup_min_lr=0",
    "scheduler.params.warmup_max_lr=3e-5",
    "scheduler.params.warmup_num_steps=10",
    "scheduler.params.total_num_steps=100",
    "zero_optimization.stage3_prefetch_bucket_size=3774873",
    "zero_optimization.stage3_param_persistence_threshold=20480",
)

CASES = {
    "bert_adam_no_bias_correction": Case(world=8),
    "megatron_guard_flags_bf16": Case(world=16),
    "megatron_offload_param_stage2": Case(
        world=2, changed=("zero_optimization.offload_param.device",)
    ),
    "hf_zero2_auto": Case(world=2, settings=HF_ZERO2),
    # No warmup_type: DeepSpeed's WarmupDecayLR warms up on a log curve (warmup_shape: log).
    "hf_zero3_auto_scheduler": Case(world=2, settings=HF_ZERO3),
    "fp16_autocast_prescale_warmup": Case(world=4, given_world=True),
    # The monitors change no math: carried into deepspeed.observability and rendered back.
    "pipeline_sgd_monitors": Case(world=4, given_world=True, refused=("scheduler",)),
}


def config_of(name: str) -> dict[str, Any]:
    data = json.loads((CORPUS / f"{name}.json").read_text())
    return apply_settings(data, CASES[name].settings)


def world_of(name: str) -> int | None:
    case = CASES[name]
    return case.world if case.given_world else None


def leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    found: dict[str, Any] = {}
    for key, value in data.items():
        found |= leaves(value, f"{prefix}.{key}" if prefix else key)
    return found


def same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def oracle(config: dict[str, Any], spec: TrainSpec, world: int) -> Any:
    """DeepSpeed's own parser on the rendered config (raises on anything it refuses)."""
    dp = world // spec.parallel.pipeline
    return deepspeed_parse(config, dp)


def test_the_corpus_is_every_file() -> None:
    assert sorted(CASES) == sorted(path.stem for path in CORPUS.glob("*.json"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_originals_are_valid_deepspeed_configs(name: str) -> None:
    config = config_of(name)
    dp = CASES[name].world // config.get("pipeline", {}).get("stages", 1)
    deepspeed_parse(config, dp)


@pytest.mark.parametrize("name", sorted(CASES))
def test_strict_import_accepts_or_names_exactly_the_dropped_keys(name: str) -> None:
    case = CASES[name]
    if not case.refused:
        spec_from_deepspeed(config_of(name), world_size=world_of(name))
        return
    with pytest.raises(SpecError) as caught:
        spec_from_deepspeed(config_of(name), world_size=world_of(name))
    assert [issue.path for issue in caught.value.issues] == list(case.refused)
    assert all(issue.hint == LOSSY_HINT for issue in caught.value.issues)


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_keeps_every_key_and_deepspeed_accepts_it(name: str) -> None:
    case = CASES[name]
    original = config_of(name)
    imported = spec_from_deepspeed(original, world_size=world_of(name), lossy=True)
    assert [item.path for item in imported.dropped] == list(case.refused)
    assert [item.path for item in imported.left_out] == list(case.left_out)
    spec = imported.spec
    rendered = deepspeed_config(spec, case.world)
    parsed = oracle(rendered, spec, case.world)
    if "train_batch_size" in original:
        assert parsed.train_batch_size == original["train_batch_size"]
    got = leaves(rendered)
    kept = {
        path: value
        for path, value in leaves(original).items()
        if not any(
            path == key or path.startswith(key + ".") for key in (*case.refused, *case.left_out)
        )
        and path not in case.changed
    }
    wrong = {
        path: (value, got.get(path, "<missing>"))
        for path, value in kept.items()
        if not (path == "optimizer.type" and str(value).lower() in ("adam", "adamw"))
        and not same(value, got.get(path))
    }
    assert len(kept) >= 4 and not wrong, wrong
    if "optimizer" not in original:
        assert "optimizer" not in rendered  # the script brings its own; no AdamW at lr 1e-3


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cli_writes_a_spec_that_renders_the_same(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[name]
    source = tmp_path / "ds.json"
    source.write_text(json.dumps(json.loads((CORPUS / f"{name}.json").read_text())))
    argv = ["spec", "from-deepspeed", str(source), "--lossy", "-o", str(tmp_path / "s.yaml")]
    argv += [f"--set={setting}" for setting in case.settings]
    if case.given_world:
        argv += ["--world-size", str(case.world)]
    assert main(argv) == 0, capsys.readouterr().err
    text = (tmp_path / "s.yaml").read_text()
    assert commented_keys(text, "NOT carried") == list(case.refused)
    assert commented_keys(text, "change no math") == list(case.left_out)
    spec = load_spec(tmp_path / "s.yaml")
    assert yaml.safe_load(text)["backend"] == spec.backend
    capsys.readouterr()
    out = tmp_path / "again.json"
    argv = ["config", "deepspeed", "--spec", str(tmp_path / "s.yaml"), "-o", str(out)]
    assert main([*argv, "--world-size", str(case.world)]) == 0
    assert json.loads(out.read_text()) == deepspeed_config(spec, case.world)


def commented_keys(spec_text: str, block: str) -> list[str]:
    """The config keys listed in the comment block (at the top of an imported spec) whose
    heading says `block`."""
    found: list[str] = []
    inside = False
    for line in spec_text.splitlines():
        if not line.startswith("#   "):
            inside = line.startswith("#") and block in line
        elif inside:
            found.append(line.removeprefix("#   ").split(":")[0])
    return found


def test_megatron_guard_flags_are_rendered_as_imported() -> None:
    spec = spec_from_deepspeed(config_of("megatron_guard_flags_bf16")).spec
    parsed = oracle(deepspeed_config(spec, 16), spec, 16)
    assert parsed.zero_allow_untested_optimizer is True
    assert parsed.zero_force_ds_cpu_optimizer is False
    assert spec.optimizer.name == "script"
    assert spec.deepspeed.grad_accum_dtype == "fp32"


def test_bert_adam_keeps_bias_correction_off() -> None:
    spec = spec_from_deepspeed(config_of("bert_adam_no_bias_correction")).spec
    params = deepspeed_config(spec, 8)["optimizer"]["params"]
    assert (params["bias_correction"], params["torch_adam"], params["adam_w_mode"]) == (
        False,
        False,
        True,
    )


def test_a_scheduler_without_warmup_type_gets_the_log_warmup_written_out() -> None:
    imported = spec_from_deepspeed(config_of("hf_zero3_auto_scheduler"), world_size=2)
    schedule = imported.spec.schedule
    assert (schedule.name, schedule.warmup_shape, schedule.warmup_steps) == (
        "warmup_linear",
        "log",
        10,
    )
    params = deepspeed_config(imported.spec, 2)["scheduler"]["params"]
    assert params["warmup_type"] == "log"


def test_removed_keys_match_deepspeeds_list() -> None:
    top = set(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    zero = {f"zero_optimization.{key}" for key in ds_config._REMOVED_ZERO_CONFIG_KEYS}
    assert top | zero == set(REMOVED)
