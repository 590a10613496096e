"""backend fsdp's choices before any process group: which modules become units, the fp32 model
it shards, and the spec rules (its precisions, the hybrid layout). Its training, parity and
checkpoints run for real in tests/test_parity.py, test_engines_real.py and test_resume_real.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from toolkit.backends.fsdp.backend import _require_fp32, clip_sharded, units_of
from toolkit.backends.fsdp.tensor import stores_weight_transposed, tensor_plan
from toolkit.errors import ToolkitError
from toolkit.spec import SpecError, TrainSpec


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = torch.nn.Linear(4, 4)
        self.mlp = torch.nn.Linear(4, 4)


class Tower(torch.nn.Module):
    """A transformer's shape: embeddings, a ModuleList of blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(4, 10)


def test_the_repeated_blocks_of_a_module_list_are_the_units() -> None:
    tower = Tower()
    assert units_of(tower, ()) == list(tower.blocks)


def test_a_sequentials_children_with_parameters_are_the_units() -> None:
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    assert units_of(mlp, ()) == [mlp[0], mlp[2]]


def test_a_model_without_repeated_blocks_is_one_unit() -> None:
    assert units_of(torch.nn.Linear(4, 4), ()) == []


def test_wrap_names_the_classes_outermost_first() -> None:
    tower = Tower()
    units = units_of(tower, ("Block", "Linear"))
    assert units[0] is tower.blocks[0]
    assert units.index(tower.blocks[0]) < units.index(tower.blocks[0].attention)
    assert tower.head in units and tower.embed not in units


def test_wrap_naming_a_class_the_model_lacks_is_refused_listing_its_classes() -> None:
    with pytest.raises(ToolkitError) as caught:
        units_of(Tower(), ("GPT2Block",))
    assert "fsdp.wrap names ['GPT2Block']" in str(caught.value)
    assert "Block" in (caught.value.hint or "") and "Tower" in (caught.value.hint or "")


def test_a_model_cast_to_bf16_before_sharding_is_refused() -> None:
    _require_fp32(Tower())
    with pytest.raises(ToolkitError) as caught:
        _require_fp32(Tower().to(torch.bfloat16))
    assert "torch.bfloat16" in str(caught.value)
    assert "precision: bf16" in (caught.value.hint or "")


def _issues(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict(data)
    return {issue.path: issue.allowed for issue in caught.value.issues}


def test_fsdp_trains_in_every_precision() -> None:
    for precision in ("fp32", "bf16", "fp16"):
        assert TrainSpec.from_dict({"backend": "fsdp", "precision": precision})


def test_replicate_must_divide_the_ranks() -> None:
    hybrid = TrainSpec.from_dict(
        {"backend": "fsdp", "parallel": {"replicate": 2}, "launch": {"np": 4}}
    )
    assert hybrid.parallel.replicate == 2
    issues = _issues({"backend": "fsdp", "parallel": {"replicate": 3}, "launch": {"np": 4}})
    assert list(issues) == ["parallel.replicate"]


def test_fsdp_offloads_to_the_host_only() -> None:
    assert list(_issues({"backend": "fsdp", "fsdp": {"offload": "nvme"}})) == ["fsdp.offload"]


def test_hugging_faces_conv1d_is_split_along_its_transposed_weight() -> None:
    pytorch_utils = pytest.importorskip("transformers.pytorch_utils")
    conv1d = pytorch_utils.Conv1D(nf=16, nx=8)  # weight (in 8, out 16)
    assert stores_weight_transposed(conv1d)
    assert not stores_weight_transposed(torch.nn.Linear(8, 16))
    assert not stores_weight_transposed(torch.nn.Conv1d(8, 16, 3))


def test_the_spec_plan_is_checked_against_the_models_modules() -> None:
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    plan = tensor_plan(mlp, {"0": "colwise", "2": "rowwise"})
    assert isinstance(plan["0"], ColwiseParallel) and isinstance(plan["2"], RowwiseParallel)
    with pytest.raises(ToolkitError) as caught:
        tensor_plan(mlp, {"layers.*.up": "colwise"})
    assert "names no module" in str(caught.value)
    with pytest.raises(ToolkitError) as caught:
        tensor_plan(mlp, {})
    assert "no tensor-parallel plan of its own" in str(caught.value)


def test_a_models_own_plan_is_used_and_its_styles_checked() -> None:
    tower = Tower()
    tower._tp_plan = {"blocks.*.attention": "colwise", "blocks.*.mlp": "rowwise"}  # type: ignore[assignment]
    assert len(tensor_plan(tower, {})) == 2
    tower._tp_plan = {"head": "colwise_rep"}  # type: ignore[assignment]
    with pytest.raises(ToolkitError) as caught:
        tensor_plan(tower, {})
    assert "'colwise_rep' is not a style the toolkit runs" in str(caught.value)


def test_clipping_plain_gradients_is_torchs_clip() -> None:
    torch.manual_seed(3)
    ours, torchs = Tower(), Tower()
    torchs.load_state_dict(ours.state_dict())
    for model in (ours, torchs):
        model.head(model.blocks[0].mlp(model.embed(torch.arange(6)))).square().sum().backward()
    clip_sharded(list(ours.parameters()), 0.5)
    torch.nn.utils.clip_grad_norm_(torchs.parameters(), 0.5)
    for mine, theirs in zip(ours.parameters(), torchs.parameters(), strict=True):
        if theirs.grad is not None:
            torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-6, atol=0)


def test_tensor_parallelism_needs_an_engine_that_runs_it_and_divides_the_data_ranks() -> None:
    spec = TrainSpec.from_dict(
        {"backend": "fsdp", "batch": {"global": 32}, "parallel": {"tensor": 2}, "launch": {"np": 4}}
    )
    assert spec.batch_for().dp == 2 and spec.batch_for().micro == 16
    assert list(_issues({"backend": "ddp", "parallel": {"tensor": 2}})) == ["parallel.tensor"]
    assert list(_issues({"backend": "fsdp", "parallel": {"tensor": 3}, "launch": {"np": 4}})) == [
        "parallel.tensor"
    ]
    hybrid = {"backend": "fsdp", "parallel": {"replicate": 2, "tensor": 2}}
    assert list(_issues({**hybrid, "launch": {"np": 4}})) == ["parallel.replicate"]
    bad_pattern = {"backend": "fsdp", "parallel": {"tensor_plan": {"a b": "colwise"}}}
    assert list(_issues(bad_pattern)) == ["parallel.tensor_plan.a b"]


def test_offload_to_the_host_is_refused_for_a_cpu_job() -> None:
    assert list(_issues({"backend": "fsdp", "device": "cpu", "fsdp": {"offload": "cpu"}})) == [
        "fsdp.offload"
    ]
    gpu_job = {"backend": "fsdp", "device": "cuda", "fsdp": {"offload": "cpu"}}
    assert TrainSpec.from_dict(gpu_job).fsdp.offload == "cpu"
