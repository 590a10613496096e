"""DeepSpeed's own config parser as the tests' oracle for what DeepSpeed accepts."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest

ds_config = pytest.importorskip("deepspeed.runtime.config")


class DataParallelUnit:
    """What DeepSpeedConfig asks a model-parallel unit for: the data-parallel size."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def deepspeed_parse(config: dict[str, Any], data_parallel: int) -> Any:
    """`DeepSpeedConfig` of `config` for `data_parallel` ranks; raises what DeepSpeed refuses.

    DeepSpeedConfig trusts its `mpu` only when deepspeed.comm answers get_rank(); without an
    initialised process group it silently assumes a world of 1 and ignores `mpu`, so get_rank
    is answered for the call."""
    with mock.patch.object(ds_config.dist, "get_rank", return_value=0):
        copy = json.loads(json.dumps(config))
        return ds_config.DeepSpeedConfig(copy, mpu=DataParallelUnit(data_parallel))
