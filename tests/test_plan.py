"""`toolkit plan` against DeepSpeed's own memory estimators, its formulas, and its CLI.

DeepSpeed's `estimate_zero2/3_model_states_mem_needs_all_cold` print, per offload option, the
memory per CPU (node) and per GPU (rank) for mixed-precision Adam. They run in a subprocess
(importing DeepSpeed picks an accelerator and may touch the environment), with
additional_buffer_factor=1.0 so that their CPU figures are the model states themselves.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.plan import communication as comm
from toolkit.plan import memory as mem
from toolkit.plan.model_facts import ModelFacts, from_params
from toolkit.plan.table import MIB, plan_rows, stage_split
from toolkit.spec import TrainSpec

ROOT = Path(__file__).resolve().parents[1]
CASES = [(10**9, 10**8, 1), (7 * 10**9, 3 * 10**8, 2), (3 * 10**10, 10**9, 4)]

ESTIMATE = r"""
import contextlib, io, json, sys
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
out = {}
for total, largest, gpus in json.loads(sys.argv[1]):
    for name, call in (
        ("zero2", lambda: estimate_zero2_model_states_mem_needs_all_cold(
            total, num_gpus_per_node=gpus, additional_buffer_factor=1.0)),
        ("zero3", lambda: estimate_zero3_model_states_mem_needs_all_cold(
            total, largest, num_gpus_per_node=gpus, additional_buffer_factor=1.0)),
    ):
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            call()
        out[f"{name}/{total}/{gpus}"] = text.getvalue()
print(json.dumps(out))
"""
ROW = re.compile(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$")
GIB = float(1 << 30)


def _options(text: str) -> str:
    """'offload_param=OffloadDeviceEnum.cpu , ...' -> 'offload_param=cpu, ...' (enum str varies)"""
    return re.sub(r"\s+,", ",", text.replace("OffloadDeviceEnum.", "").strip())


@pytest.fixture(scope="module")
def deepspeed_estimates() -> dict[str, dict[str, tuple[float, float]]]:
    """(estimator/total/gpus) -> options text -> (GiB per CPU, GiB per GPU)."""
    done = subprocess.run(
        [sys.executable, "-c", ESTIMATE, json.dumps(CASES)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    parsed: dict[str, dict[str, tuple[float, float]]] = {}
    for key, text in printed.items():
        rows = [ROW.match(line) for line in text.splitlines()]
        parsed[key] = {
            _options(m.group(3)): (float(m.group(1)), float(m.group(2))) for m in rows if m
        }
    return parsed


def _adam_bf16(ranks: int) -> TrainSpec:
    return TrainSpec.from_dict(
        {
            "backend": "deepspeed",
            "optimizer": {"name": "adamw"},
            "precision": "bf16",
            "batch": {"global": 8 * ranks, "micro": 8},
            "launch": {"np": ranks},
        }
    )


def _plan(total: int, largest: int, ranks: int, layout: mem.ZeroLayout) -> mem.Memory:
    return mem.zero(
        _adam_bf16(ranks),
        layout,
        parameters=total,
        largest_layer=largest,
        ranks=ranks,
        activations=None,
    )


def _close(ours_bytes: float, theirs_gib: float) -> bool:
    # Their figures are printed in GiB with 2 decimals: allow 5% or half a printed digit.
    ours = ours_bytes / GIB
    return abs(ours - theirs_gib) <= max(0.05 * theirs_gib, 0.005)


@pytest.mark.parametrize(("total", "largest", "gpus"), CASES)
def test_zero2_agrees_with_deepspeed(deepspeed_estimates, total, largest, gpus) -> None:
    printed = deepspeed_estimates[f"zero2/{total}/{gpus}"]
    for offload, options in ((False, "offload_optimizer=none"), (True, "offload_optimizer=cpu")):
        cpu, gpu = printed[options]
        ours = _plan(total, largest, gpus, mem.ZeroLayout(stage=2, offload_optimizer=offload))
        assert _close(ours.device_model_states, gpu), (options, ours.device_model_states, gpu)
        if offload:  # their CPU figure is per node: every rank's host share together
            assert _close(ours.host_model_states * gpus, cpu), (options, cpu)


@pytest.mark.parametrize(("total", "largest", "gpus"), CASES)
def test_zero3_agrees_with_deepspeed(deepspeed_estimates, total, largest, gpus) -> None:
    printed = deepspeed_estimates[f"zero3/{total}/{gpus}"]
    layouts = {
        "offload_param=none, offload_optimizer=none, zero_init=1": mem.ZeroLayout(stage=3),
        "offload_param=none, offload_optimizer=cpu, zero_init=1": mem.ZeroLayout(
            stage=3, offload_optimizer=True
        ),
        "offload_param=cpu, offload_optimizer=cpu, zero_init=1": mem.ZeroLayout(
            stage=3, offload_optimizer=True, offload_params=True
        ),
    }
    for options, layout in layouts.items():
        cpu, gpu = printed[options]
        ours = _plan(total, largest, gpus, layout)
        assert _close(ours.device_model_states, gpu), (options, ours.device_model_states, gpu)
        if layout.offload_optimizer:
            assert _close(ours.host_model_states * gpus, cpu), (options, cpu)


def test_optimizer_states_follow_the_spec() -> None:
    def states(optimizer: dict) -> float:
        spec = TrainSpec.from_dict({"optimizer": optimizer, "launch": {"np": 4}})
        rows = plan_rows(spec, from_params(1000), 4)
        return next(r for r in rows if r.name == "deepspeed zero-1").memory.device["optimizer"]

    assert states({"name": "adam"}) == 8 * 1000 / 4
    assert states({"name": "sgd", "momentum": 0.9}) == 4 * 1000 / 4
    assert states({"name": "sgd"}) == 0


def test_communication_and_bubble_formulas() -> None:
    assert comm.allreduce_bytes(1000, 4, 4.0) == 2 * 3 / 4 * 1000 * 4
    assert comm.allreduce_bytes(1000, 1, 4.0) == 0
    spec = TrainSpec()
    # ZeRO-3 moves 1.5x what an allreduce does (one more all-gather of the weights).
    assert comm.zero_bytes(
        spec, stage=3, parameters=1000, ranks=4, micro_batches=1
    ) == pytest.approx(1.5 * comm.allreduce_bytes(1000, 4, 4.0))
    assert comm.bubble(2, 4) == pytest.approx(1 / 5)
    assert comm.bubble(4, 8) == pytest.approx(3 / 11)


@pytest.mark.parametrize("view", [True, False])
def test_ddp_buckets_are_a_second_gradient_copy_unless_views(view: bool) -> None:
    ddp = {"gradient_as_bucket_view": view}
    spec = TrainSpec.from_dict({"backend": "ddp", "ddp": ddp})
    (row,) = [r for r in plan_rows(spec, from_params(1000), 2) if r.name == "ddp+torch"]
    assert row.memory.device["gradients"] == 4000
    assert row.memory.device["buffers"] == (0 if view else 4000)


@pytest.mark.parametrize(
    ("layers", "fusion_mib"),
    [
        ((MIB, MIB), 8),  # every layer fuses: 8 MiB of gradients touch 8 MiB of the buffer
        ((10 * MIB, 10 * MIB), 64),  # 80 MiB of small layers fill the 64 MiB buffer
        ((17 * MIB, MIB, 0), 4),  # the 68 MiB layer is reduced alone, in place
        ((), 64),  # layers unknown: every gradient may fuse, up to the buffer
    ],
)
def test_horovod_counts_the_part_of_its_fusion_buffer_a_step_touches(
    layers: tuple[int, ...], fusion_mib: int
) -> None:
    spec = TrainSpec.from_dict({"backend": "horovod", "horovod": {"fusion_threshold_mb": 64}})
    facts = ModelFacts(
        parameters=max(sum(layers), 20 * MIB),
        largest_layer=max(layers, default=20 * MIB),
        layer_parameters=layers,
    )
    (row,) = [r for r in plan_rows(spec, facts, 2) if r.name == "horovod+torch"]
    assert row.memory.device["buffers"] == fusion_mib * MIB


@pytest.mark.parametrize(("stage", "buckets"), [(0, 0), (1, 1), (2, 2), (3, 2)])
def test_zero_buffers_are_its_reduction_copies(stage: int, buckets: int) -> None:
    """fp32, a bucket smaller than the model: ZeRO-1 all-reduces a flattened copy of the
    bucket, ZeRO-2 and ZeRO-3 also keep the contiguous bucket itself; ZeRO-0 flattens every
    gradient at once."""
    zero = {"stage": stage, "reduce_bucket_size": 1000}
    spec = TrainSpec.from_dict({"backend": "deepspeed", "zero": zero})
    layout = mem.ZeroLayout(stage=stage)
    memory = mem.zero(spec, layout, parameters=10_000, largest_layer=100, ranks=2, activations=0)
    expected = 4 * 10_000 if stage == 0 else buckets * 4 * 1000
    assert memory.device["buffers"] == expected


@pytest.mark.parametrize(
    ("bucket", "first_layer", "working"),
    [
        (10_000, 30, 30),  # one reduction as backward ends: the first layer is still gathered
        (10_000, None, 100),  # ... the largest layer when the layers are unknown
        (1000, 30, 200),  # a gradient that does not fit: its layer's weights and gradient
    ],
)
def test_zero3_working_set_at_its_reductions(
    bucket: int, first_layer: int | None, working: int
) -> None:
    spec = TrainSpec.from_dict({"backend": "deepspeed", "zero": {"reduce_bucket_size": bucket}})
    memory = mem.zero(
        spec,
        mem.ZeroLayout(stage=3),
        parameters=10_000,
        largest_layer=100,
        ranks=2,
        activations=0,
        first_layer=first_layer,
    )
    assert memory.device["working"] == 4 * working


def test_first_layer_is_the_first_with_parameters() -> None:
    facts = ModelFacts(parameters=8, largest_layer=5, layer_parameters=(0, 5, 0, 3))
    assert facts.first_layer == 5
    assert ModelFacts(parameters=8, largest_layer=8).first_layer is None


def test_zero3_clones_an_fp32_partition_for_its_optimizer() -> None:
    """DeepSpeed's ZeRO-3 would share it, but its device test never passes (module docs)."""
    spec = TrainSpec.from_dict({"backend": "deepspeed", "precision": "fp32"})
    memory = mem.zero(
        spec, mem.ZeroLayout(stage=3), parameters=10_000, largest_layer=100, ranks=2, activations=0
    )
    assert memory.device["master"] == memory.device["parameters"] == 4 * 10_000 / 2


@pytest.mark.parametrize(("stage", "apart"), [(1, 20_000), (2, 8000)])
def test_zero12_totals_count_the_copy_or_the_partition_not_both(stage: int, apart: int) -> None:
    """fp32, 2 ranks, 10,000 parameters: the fp32 gradient partition (20,000 bytes) is never
    held beside what only backward holds. At ZeRO-2 that is a 1,000-element bucket and its
    flattened copy (8,000 bytes); at ZeRO-1 the copy (4,000) and the gradients outside the
    rank's partition (20,000), which its epilogue clears, so the whole partition is apart."""
    zero = {"stage": stage, "reduce_bucket_size": 1000}
    spec = TrainSpec.from_dict({"backend": "deepspeed", "zero": zero})
    layout = mem.ZeroLayout(stage=stage)
    memory = mem.zero(spec, layout, parameters=10_000, largest_layer=100, ranks=2, activations=0)
    summed = sum(memory.device.values()) + sum(memory.host.values())
    assert memory.never_together == apart
    assert memory.total == summed - apart


def test_zero2_reduces_a_layer_larger_than_the_bucket_beside_the_bucket() -> None:
    """A 6,000-element layer does not fit a 1,000-element bucket: its own gradient is reduced
    while the bucket stays allocated, 4 * (1,000 + 6,000) bytes, more than the bucket and its
    copy; a layer that fits leaves the bucket and its copy."""
    zero = {"stage": 2, "reduce_bucket_size": 1000}
    spec = TrainSpec.from_dict({"backend": "deepspeed", "zero": zero})
    assert mem.zero2_buckets(4.0, 10_000, 1000, 6000) == 4 * 7000
    assert mem.zero2_buckets(4.0, 10_000, 1000, 500) == 4 * 2000
    assert mem.zero2_buckets(4.0, 10_000, 50_000, 6000) == 4 * 20_000  # the whole model, twice
    layout = mem.ZeroLayout(stage=2)
    memory = mem.zero(spec, layout, parameters=10_000, largest_layer=6000, ranks=2, activations=0)
    assert memory.device["buffers"] == 4 * (1000 + 6000)


@pytest.mark.parametrize(
    "layout",
    [
        mem.ZeroLayout(stage=0),
        mem.ZeroLayout(stage=3),
        mem.ZeroLayout(stage=2, offload_optimizer=True),
    ],
)
def test_other_layouts_hold_everything_they_count_at_once(layout: mem.ZeroLayout) -> None:
    spec = TrainSpec.from_dict({"backend": "deepspeed", "zero": {"stage": layout.stage}})
    memory = mem.zero(spec, layout, parameters=10_000, largest_layer=100, ranks=2, activations=0)
    assert memory.never_together == 0
    assert memory.total == sum(memory.device.values()) + sum(memory.host.values())


def test_pipeline_split_balances_parameters() -> None:
    assert stage_split((10, 0, 10, 0, 10, 0, 10), 2) == [2]
    assert stage_split((1, 1, 1, 1), 4) == [0, 1, 2]


def test_plan_cli_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "backend: deepspeed\npipeline: {stages: 2}\nbatch: {global: 8, micro: 2}\nlaunch: {np: 2}\n"
    )
    module = tmp_path / "tiny_model.py"
    module.write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),"
        " torch.nn.Linear(16, 4))\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        assert main(["plan", "--spec", str(spec), "--model", "tiny_model:build"]) == 0
        table = capsys.readouterr().out
        assert "deepspeed zero-3" in table and "pipeline p=2 m=4" in table
        out = tmp_path / "plan.json"
        assert (
            main(["plan", "--spec", str(spec), "--params", "1000", "--json", "-o", str(out)]) == 0
        )
    finally:
        sys.path.remove(str(tmp_path))
    data = json.loads(out.read_text())
    assert data["model"]["parameters"] == 1000
    pipeline = next(row for row in data["rows"] if row["name"].startswith("deepspeed pipeline"))
    assert pipeline["bubble"] == pytest.approx(1 / 5)


def test_plan_cli_bad_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("backend: ddp\n")
    assert main(["plan", "--spec", str(spec), "--model", "no_such_module_here:build"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("toolkit: error: --model='no_such_module_here:build'")
    assert len(error.splitlines()) == 1


def test_tensor_parallel_rows_split_the_planned_layers_before_fsdp_shards() -> None:
    named = (("0", 8 * 16 + 16), ("1", 0), ("2", 16 * 4 + 4))
    facts = ModelFacts(
        parameters=212, largest_layer=144, layer_parameters=(144, 0, 68), named_layers=named
    )
    spec = TrainSpec.from_dict(
        {
            "backend": "fsdp",
            "batch": {"global": 8},
            "parallel": {"tensor": 2, "tensor_plan": {"0": "colwise"}},
            "launch": {"np": 4},
        }
    )
    (row, offloaded) = [r for r in plan_rows(spec, facts, 4) if r.name.startswith("fsdp")]
    assert (row.name, offloaded.name) == ("fsdp+torch tensor 2", "fsdp+torch tensor 2 offload cpu")
    held = 68 + 144 // 2  # the unplanned layer whole, half of the planned one
    assert row.memory.device["parameters"] == 4.0 * held / 2  # sharded over data 2
    assert "tensor 2: 144 planned parameters split" in row.note
    assert facts.planned_parameters({"*": "colwise"}) == 212
    assert from_params(212).planned_parameters({"0": "colwise"}) == 0


def test_activation_checkpointing_keeps_each_recomputed_blocks_input_and_one_blocks_insides() -> (
    None
):
    from toolkit.plan.model_facts import from_factory

    facts = from_factory("tests.plan_models:blocks")
    # What autograd saves for one sample, each storage once: the first Linear's input (16);
    # in each Block its input (16, for up's weight gradient) and Tanh's output (64, which down
    # also saves); the last Linear's input (16).
    assert facts.activations_per_sample == 16 + 3 * (16 + 64) + 16
    # Recomputing the Blocks keeps each Block's input (16 each) and, while backward recomputes
    # one, what it saves (80).
    assert facts.kept_per_sample(["Block"]) == 16 + 16 + 3 * 16 + 80
    spec = TrainSpec.from_dict(
        {
            "backend": "ddp",
            "batch": {"global": 8, "micro": 8},
            "launch": {"np": 1},
            "activation_checkpointing": {"modules": ["Block"]},
        }
    )
    [row] = [r for r in plan_rows(spec, facts, ranks=1) if r.name == "ddp+torch"]
    assert row.memory.activations == 8 * 4 * facts.kept_per_sample(["Block"])


def test_facts_without_layer_names_plan_activations_as_the_leaf_outputs() -> None:
    """Facts built by hand (the GPU check's, from a run's JSON) have no names to match a
    recomputed class against: activations are the input and the leaves' outputs."""
    facts = ModelFacts(parameters=10, largest_layer=5, layer_activations=(3, 4), input_elements=2)
    assert facts.kept_per_sample(["GPT2Block"]) == facts.activations_per_sample == 9
