"""The training spec: one typed, validated description of a job for every engine.

    from toolkit.spec import TrainSpec, load_spec, SpecError
    spec = load_spec("train.yaml")          # or TrainSpec.from_dict(data), or TrainSpec(...)
    spec.batch_for(8)                       # ResolvedBatch(global_, micro, accumulation, dp)

Imports no engine: only the standard library, PyYAML and pydantic.
"""

from toolkit.spec.batch import ResolvedBatch
from toolkit.spec.errors import SpecError, SpecIssue
from toolkit.spec.hosts import Host
from toolkit.spec.load import dump_spec, load_spec
from toolkit.spec.model import TrainSpec
from toolkit.spec.sections import (
    BatchSpec,
    CheckpointSpec,
    HorovodSpec,
    LaunchSpec,
    LossScalingSpec,
    OptimizerSpec,
    PipelineSpec,
    TfSpec,
    ZeroSpec,
)

__all__ = [
    "BatchSpec",
    "CheckpointSpec",
    "HorovodSpec",
    "Host",
    "LaunchSpec",
    "LossScalingSpec",
    "OptimizerSpec",
    "PipelineSpec",
    "ResolvedBatch",
    "SpecError",
    "SpecIssue",
    "TfSpec",
    "TrainSpec",
    "ZeroSpec",
    "dump_spec",
    "load_spec",
]
