"""Gradient compression in the spec (`compression`): which engine runs which method, and the
refusals that say why. The runs are parity cases (`toolkit parity --cases compression`)."""

from __future__ import annotations

from typing import Any

import pytest

from toolkit.plan import communication
from toolkit.spec import SpecError, TrainSpec


def spec(**fields: Any) -> TrainSpec:
    return TrainSpec.from_dict({"batch": {"global": 16}, **fields})


@pytest.mark.parametrize(
    ("fields", "path", "allowed"),
    [
        ({"backend": "horovod", "compression": "powersgd"}, "compression", "none, fp16"),
        ({"backend": "deepspeed", "compression": "powersgd"}, "compression", "none, fp16"),
        (
            {
                "backend": "deepspeed",
                "compression": "fp16",
                "deepspeed": {"communication_data_type": "fp32"},
            },
            "deepspeed.communication_data_type",
            "fp16 or unset",
        ),
        ({"backend": "fsdp", "compression": "fp16"}, "compression", "none with"),
        (
            {"backend": "deepspeed", "compression": "onebit_adam", "device": "cpu"},
            "compression",
            "has no 1-bit Adam",
        ),
        (
            {"backend": "deepspeed", "compression": "onebit_adam", "device": "cuda"},
            "compression",
            "on GPUs only",
        ),
        ({"backend": "tf", "compression": "fp16"}, "compression", "none with"),
        (
            {"backend": "ddp", "compression": "bf16", "device": "cpu"},
            "compression",
            "needs CUDA 11+ with NCCL 2.10+",
        ),
        (
            {"backend": "horovod", "compression": "fp16", "horovod": {"compression": "none"}},
            None,
            None,
        ),
        (
            {
                "backend": "horovod",
                "horovod": {"op": "adasum"},
                "launch": {"np": 3},
                "batch": {"global": 12},
            },
            "horovod.op",
            "power-of-two",
        ),
    ],
)
def test_compression_only_where_the_engine_runs_it(
    fields: dict[str, Any], path: str | None, allowed: str | None
) -> None:
    if path is None:
        assert spec(**fields).wire_compression == "fp16"
        return
    with pytest.raises(SpecError) as caught:
        spec(**fields)
    [issue] = caught.value.issues
    assert issue.path == path and allowed in issue.allowed


def test_horovods_own_field_is_the_earlier_spelling() -> None:
    assert spec(backend="horovod", horovod={"compression": "fp16"}).wire_compression == "fp16"
    with pytest.raises(SpecError, match=r"horovod\.compression"):
        spec(backend="ddp", compression="powersgd", horovod={"compression": "fp16"})


def test_a_16_bit_cast_halves_the_planned_bytes() -> None:
    plain, cast = spec(backend="ddp"), spec(backend="ddp", compression="fp16")
    assert communication.gradient_bytes(cast, zero_engine=False) == 2.0
    assert communication.gradient_bytes(plain, zero_engine=False) == 4.0


def test_deepspeed_compresses_by_reducing_in_fp16() -> None:
    from toolkit.render.deepspeed import deepspeed_config

    rendered = deepspeed_config(spec(backend="deepspeed", compression="fp16"))
    assert rendered["communication_data_type"] == "fp16"
    assert deepspeed_config(spec(backend="deepspeed"))["communication_data_type"] == "fp32"
