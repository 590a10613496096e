"""Parity references are shared only by cases whose reference math is the same."""

from __future__ import annotations

from typing import Any

from toolkit.parity.harness import reference_key
from toolkit.spec import TrainSpec

BASE: dict[str, Any] = {"backend": "ddp", "seed": 7, "optimizer": {"name": "adamw", "lr": 0.01}}


def key(**changes: Any) -> str:
    return reference_key("torch", "mlp", 20, TrainSpec.from_dict({**BASE, **changes}))


def test_engines_share_the_reference() -> None:
    assert key() == key(backend="deepspeed", zero={"stage": 2})


def test_a_schedule_is_another_reference() -> None:
    cosine = {"name": "warmup_cosine", "warmup_steps": 3, "total_steps": 20}
    assert key() != key(schedule=cosine)


def test_optimizer_seed_and_clipping_are_other_references() -> None:
    assert key() != key(seed=8)
    assert key() != key(optimizer={"name": "adamw", "lr": 0.02})
    assert key() != key(clip_grad_norm=1.0)
