"""backend fsdp's choices before any process group: which modules become units, the fp32 model
it shards, and the spec rules (its precisions, the hybrid layout). Its training, parity and
checkpoints run for real in tests/test_parity.py, test_engines_real.py and test_resume_real.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from toolkit.backends.fsdp.backend import _require_fp32, units_of
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


def test_fsdp_trains_in_fp32_and_bf16_only() -> None:
    for precision in ("fp32", "bf16"):
        assert TrainSpec.from_dict({"backend": "fsdp", "precision": precision})
    assert _issues({"backend": "fsdp", "precision": "fp16"}) == {
        "precision": "fp32 or bf16 with backend fsdp"
    }


def test_replicate_must_divide_the_ranks() -> None:
    hybrid = TrainSpec.from_dict({"backend": "fsdp", "fsdp": {"replicate": 2}, "launch": {"np": 4}})
    assert hybrid.fsdp.replicate == 2
    issues = _issues({"backend": "fsdp", "fsdp": {"replicate": 3}, "launch": {"np": 4}})
    assert list(issues) == ["fsdp.replicate"]


def test_fsdp_offloads_to_the_host_only() -> None:
    assert list(_issues({"backend": "fsdp", "fsdp": {"offload": "nvme"}})) == ["fsdp.offload"]
