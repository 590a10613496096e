"""Property: whatever a spec holds, loading it and rendering every artifact raises SpecError or
nothing. Random documents, valid specs with fields mutated to random values, and random extra
keys are fed to load_spec/TrainSpec.from_dict and then to every renderer."""

from __future__ import annotations

import contextlib
import copy
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.render import horovod, tf
from toolkit.render.deepspeed import deepspeed_config
from toolkit.render.deepspeed_import import spec_from_deepspeed
from toolkit.render.hostfile import hostfile
from toolkit.render.launchers import BUILDERS, LaunchContext, launch_plan
from toolkit.render.mpijob import mpijob_manifest
from toolkit.render.slurm import sbatch_script
from toolkit.spec import SpecError, TrainSpec, load_spec
from toolkit.spec.translate import keys_of

PRESETS = Path(__file__).resolve().parents[1] / "ds_configs" / "specs"

VALID: list[dict[str, Any]] = [
    {},
    {"backend": "tf", "launch": {"np": 2}},
    {
        "backend": "horovod",
        "batch": {"global": 64, "micro": 8},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True},
        "horovod": {"controller": "mpi", "compression": "fp16", "timeline": "tl.json"},
        "launch": {"launcher": "mpirun", "hosts": ["node1:2", "node2:2"], "env": {"A": "b"}},
    },
    {
        "backend": "deepspeed",
        "precision": "fp16",
        "zero": {
            "stage": 3,
            "offload_optimizer": "nvme",
            "offload_params": "nvme",
            "nvme_path": "/nvme",
        },
        "launch": {"hosts": ["node1:4", "node2:4"], "partition": "gpu"},
    },
    {"backend": "ddp", "launch": {"launcher": "srun", "np": 3}, "lr_scaling": "linear"},
]

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["auto", "none", "cpu", "nvme", "a; rm -rf /", "node1:4", "$(id)", "0"])
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
PLAUSIBLE = st.sampled_from(
    [
        *[0, 1, 2, 3, 4, 8, 16, 64, 0.5, 1e-3, 65535, 65536, True, False, None, "auto"],
        *["none", "cpu", "nvme", "/nvme", "gloo", "mpi", "sgd", "adam", "adamw", "fp16", "bf16"],
        *["ring", "nccl", "linear", "sum", "adasum", "uniform", "type:Linear", "tf", "ddp"],
        *["horovod", "deepspeed", "local", "mpirun", "srun", "torchrun", "horovodrun", "openmpi"],
        *[["node1:2", "node2:2"], ["localhost:3"], ["a:1", "b:2"], [0.8, 0.9], "node1:4"],
    ]
)
"""Values that often make a mutated spec valid, so the renderers see many different specs."""
CONTEXT = LaunchContext(uid=0, cpu_count=2, python="/usr/bin/python3")
COMMAND = ["train.py", "--lr", "0.1", "a; rm -rf /"]


def valid_specs() -> list[dict[str, Any]]:
    import yaml

    return VALID + [yaml.safe_load(path.read_text()) for path in sorted(PRESETS.glob("*.yaml"))]


def paths_of(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in nested dicts (and list indexes), for choosing what to mutate."""
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += paths_of(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += paths_of(value, (*prefix, index))
    return found


def set_path(data: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def render_everything(spec: TrainSpec) -> None:
    """Call every renderer; each may refuse with SpecError, nothing else."""
    calls = [
        lambda: deepspeed_config(spec),
        lambda: horovod.config_file(spec),
        lambda: horovod.environment(spec),
        lambda: horovod.horovodrun_flags(spec),
        lambda: horovod.optimizer_options(spec),
        lambda: tf.tf_config(spec, 0),
        lambda: tf.communication_options(spec),
        lambda: hostfile(spec),
        lambda: launch_plan(spec, COMMAND, CONTEXT),
        lambda: sbatch_script(spec, COMMAND),
        lambda: mpijob_manifest(spec, COMMAND),
        lambda: spec_from_deepspeed(deepspeed_config(spec)),
    ]
    calls += [lambda ws=ws: deepspeed_config(spec, ws) for ws in (1, 2, 8)]  # type: ignore[misc]
    calls += [lambda build=build: build(spec, COMMAND, CONTEXT) for build in BUILDERS.values()]  # type: ignore[misc]
    if spec.world_size <= 64:
        calls.append(lambda: tf.tf_configs(spec))
    for call in calls:
        with contextlib.suppress(SpecError):
            call()


def load_and_render(data: Any) -> None:
    try:
        spec = TrainSpec.from_dict(data)
    except SpecError as error:
        assert error.issues and "\n" not in error.one_line()
        return
    render_everything(spec)


@settings(max_examples=150, deadline=None)
@given(VALUES)
def test_random_documents(data: Any) -> None:
    load_and_render(data)
    with contextlib.suppress(SpecError):
        spec_from_deepspeed(data)


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_valid_specs_with_fields_mutated(data: st.DataObject) -> None:
    spec = copy.deepcopy(data.draw(st.sampled_from(valid_specs())))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = paths_of(spec)
        if paths:
            value = copy.deepcopy(data.draw(st.one_of(PLAUSIBLE, PLAUSIBLE, VALUES)))
            set_path(spec, data.draw(st.sampled_from(paths)), value)
    load_and_render(spec)


FREE_FORM_MAPPINGS = {("launch", "env")}
"""Mappings whose keys the user names (environment variables): any key is allowed there."""


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_valid_specs_with_random_extra_keys(data: st.DataObject) -> None:
    spec = copy.deepcopy(data.draw(st.sampled_from(valid_specs())))
    sections = [()] + [
        path
        for path in paths_of(spec)
        if isinstance(_get(spec, path), dict) and path not in FREE_FORM_MAPPINGS
    ]
    where = data.draw(st.sampled_from(sections))
    key = data.draw(st.text(max_size=10))
    target = _get(spec, where)
    if key in target or key in spec_keys_at(where):
        return
    target[key] = data.draw(VALUES)
    try:
        TrainSpec.from_dict(spec)
    except SpecError as error:
        assert any(issue.path.endswith(key) for issue in error.issues)
    else:
        raise AssertionError(f"unknown key {key!r} at {where} was accepted")


def spec_keys_at(where: tuple[Any, ...]) -> set[str]:
    """The keys the spec defines for the section at `where`: a random key that is one of them
    (say `env` under `launch`, when the drawn spec has none) is not unknown."""
    model: Any = TrainSpec
    for part in where:
        fields = {info.alias or name: info for name, info in model.model_fields.items()}
        model = fields[part].annotation
    return set(keys_of(model))


HOSTS = st.sampled_from([[], ["localhost:2"], ["node1:2", "node2:2"], ["n1:1", "n2:3"], ["a:4"]])
GENERATED = st.fixed_dictionaries(
    {
        "backend": st.sampled_from(["ddp", "horovod", "deepspeed", "tf"]),
        "batch": st.dictionaries(
            st.sampled_from(["global", "micro", "accumulation"]),
            st.integers(min_value=1, max_value=64),
        ),
        "optimizer": st.fixed_dictionaries(
            {"name": st.sampled_from(["sgd", "adam", "adamw"])},
            optional={"lr": st.floats(1e-6, 10), "weight_decay": st.floats(0, 1)},
        ),
        "precision": st.sampled_from(["fp32", "fp16", "bf16"]),
        "lr_scaling": st.sampled_from(["none", "linear"]),
        "clip_grad_norm": st.floats(0, 10),
        "zero": st.fixed_dictionaries(
            {"stage": st.integers(0, 3)},
            optional={
                "offload_optimizer": st.sampled_from(["none", "cpu", "nvme"]),
                "offload_params": st.sampled_from(["none", "cpu", "nvme"]),
                "nvme_path": st.just("/nvme"),
            },
        ),
        "parallel": st.fixed_dictionaries(
            {"pipeline": st.integers(1, 4)},
            optional={name: st.integers(1, 4) for name in ("data", "tensor", "replicate", "shard")},
        ),
        "horovod": st.fixed_dictionaries({"controller": st.sampled_from(["gloo", "mpi"])}),
        "launch": st.fixed_dictionaries(
            {"hosts": HOSTS},
            optional={
                "launcher": st.sampled_from(list(BUILDERS)),
                "np": st.integers(1, 16),
                "master_addr": st.sampled_from(["10.0.0.1", "head-node"]),
            },
        ),
    }
)


@settings(max_examples=500, deadline=None)
@given(GENERATED)
def test_generated_specs(data: dict[str, Any]) -> None:
    load_and_render(data)


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200) | VALUES.map(json.dumps), st.sampled_from(["s.yaml", "s.json"]))
def test_load_spec_on_random_files(text: str, name: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory, name)
        path.write_text(text, encoding="utf-8")
        try:
            spec = load_spec(path)
        except SpecError:
            return
        render_everything(spec)


def test_every_valid_example_is_valid() -> None:
    for data in valid_specs():
        render_everything(TrainSpec.from_dict(data))


def test_every_section_of_the_valid_examples_has_spec_keys() -> None:
    """The extra-key test reads each section's keys from the spec model; every section the
    examples hold (free-form mappings aside) must resolve to one."""
    for data in valid_specs():
        for path in paths_of(data):
            if isinstance(_get(data, path), dict) and path not in FREE_FORM_MAPPINGS:
                assert spec_keys_at(path), path
    assert "env" in spec_keys_at(("launch",))
