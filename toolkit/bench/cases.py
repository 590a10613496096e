"""Which native script stands beside each engine, how it is given the toolkit's settings, and
the cases `toolkit bench step --all` runs.

The native script of an engine is keyed by (backend, framework), the engine table's key. It
gets the toolkit's settings the way that engine normally receives them: Horovod's from the
launcher (the same plan the toolkit's run gets), DeepSpeed's as the config file the toolkit
renders, TensorFlow's communication and every engine's thread count as arguments; so
toolkit / native is the adapter's own cost.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit import engines
from toolkit.bench.workload import Workload
from toolkit.render import tf as render_tf
from toolkit.render.deepspeed import deepspeed_config
from toolkit.render.layout import rendered_threads
from toolkit.spec import TrainSpec

NATIVE_DIR = Path(__file__).with_name("native")

ArgumentsFor = Callable[[TrainSpec, Path], list[str]]


def _threads(spec: TrainSpec, _: Path) -> list[str]:
    return ["--threads", str(rendered_threads(spec))]


def _deepspeed_matched(spec: TrainSpec, workdir: Path) -> list[str]:
    path = workdir / "ds_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(deepspeed_config(spec, spec.world_size), indent=1))
    stages = ["--pipeline-stages", str(spec.parallel.pipeline)]
    return [*_threads(spec, workdir), "--ds-config", str(path), *stages]


def _ddp_matched(spec: TrainSpec, workdir: Path) -> list[str]:
    view = ["--gradient-as-bucket-view"] if spec.ddp.gradient_as_bucket_view else []
    return [*_threads(spec, workdir), "--bucket-cap-mb", str(spec.ddp.bucket_cap_mb), *view]


def _fsdp_matched(spec: TrainSpec, workdir: Path) -> list[str]:
    keep = [] if spec.fsdp.reshard_after_forward else ["--no-reshard-after-forward"]
    return [*_threads(spec, workdir), *keep]


def _tf_matched(spec: TrainSpec, workdir: Path) -> list[str]:
    implementation = render_tf.communication_options(spec)["implementation"]
    return [*_threads(spec, workdir), "--communication", implementation]


@dataclass(frozen=True, kw_only=True)
class Native:
    script: str
    """File in toolkit/bench/native/."""
    matched: ArgumentsFor
    """Arguments that give it the toolkit's settings (may write files into the work dir)."""

    @property
    def path(self) -> Path:
        return NATIVE_DIR / self.script


DDP = Native(script="ddp.py", matched=_ddp_matched)
FSDP = Native(script="fsdp.py", matched=_fsdp_matched)
HOROVOD_TORCH = Native(script="horovod_torch.py", matched=_threads)
DEEPSPEED = Native(script="ds_engine.py", matched=_deepspeed_matched)
TF_MWMS = Native(script="tf_mwms.py", matched=_tf_matched)
HOROVOD_TF = Native(script="horovod_tf.py", matched=_threads)


def native_for(spec: TrainSpec) -> Native:
    """The native script the spec's engine row names (`Engine.bench_native`; every row names
    one, tests/test_engine_table.py)."""
    entry = engines.engine(spec.backend, spec.framework_name)
    module_name, _, name = entry.bench_native.partition(":")
    native: Native = getattr(importlib.import_module(module_name), name)
    return native


PIPELINE_WORKLOAD = Workload(micro=32, micro_batches=4)
"""The pipeline case keeps the global batch of 128 as 4 micro-batches of 32 (2 stages, dp 1)."""


@dataclass(frozen=True)
class StepCase:
    name: str
    spec: dict[str, Any]
    """Spec fields over the user's spec: the engine, its variant and launcher."""
    workload: Workload = field(default_factory=Workload)


def _case(name: str, backend: str, launcher: str, **extra: Any) -> StepCase:
    spec: dict[str, Any] = {
        "backend": backend,
        "framework": extra.pop("framework", None),
        "parallel": {"pipeline": 1},
        "tf": {"local_devices": 1},
        "launch": {"launcher": launcher},
        **extra,
    }
    return StepCase(name, spec)


CASES: tuple[StepCase, ...] = (
    _case("ddp/torchrun", "ddp", "torchrun"),
    _case("fsdp/torchrun", "fsdp", "torchrun"),
    _case("horovod-torch-gloo/horovodrun", "horovod", "horovodrun", horovod={"controller": "gloo"}),
    _case("horovod-torch-mpi/horovodrun", "horovod", "horovodrun", horovod={"controller": "mpi"}),
    *(
        _case(f"zero{stage}/deepspeed", "deepspeed", "deepspeed", zero={"stage": stage})
        for stage in range(4)
    ),
    StepCase(
        "pipeline2x4/deepspeed",
        {
            "backend": "deepspeed",
            "framework": None,
            "zero": {"stage": 0},
            "parallel": {"pipeline": 2},
            "launch": {"launcher": "deepspeed"},
        },
        PIPELINE_WORKLOAD,
    ),
    _case("tf-mwms/local", "tf", "local"),
    _case(
        "horovod-tf-gloo/horovodrun",
        "horovod",
        "horovodrun",
        framework="tensorflow",
        horovod={"controller": "gloo"},
    ),
    _case(
        "horovod-tf-mpi/horovodrun",
        "horovod",
        "horovodrun",
        framework="tensorflow",
        horovod={"controller": "mpi"},
    ),
)


def case_for(spec: TrainSpec) -> StepCase:
    """The user's own spec as one case (its launcher, its settings)."""
    name = f"{spec.backend}+{spec.framework_name}/{spec.launcher}"
    workload = PIPELINE_WORKLOAD if spec.parallel.pipeline > 1 else Workload()
    return StepCase(name, {}, workload)
