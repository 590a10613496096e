"""TrainSpec: loading, defaults, strictness, the batch contract and the error format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.errors import ToolkitError
from toolkit.spec import (
    BatchSpec,
    LaunchSpec,
    OptimizerSpec,
    ResolvedBatch,
    SpecError,
    TrainSpec,
    ZeroSpec,
    dump_spec,
    load_spec,
)

DESIGN_SPEC = """
backend: deepspeed            # ddp | horovod | deepspeed | tf
framework: torch
seed: 42
batch: {global: 256, micro: 16}
optimizer: {name: adamw, lr: 3.0e-4, betas: [0.9, 0.999], eps: 1.0e-8, weight_decay: 0.01}
lr_scaling: none
clip_grad_norm: 0.0
precision: fp32
zero: {stage: 2, offload_optimizer: none, offload_params: none}
pipeline: {stages: 1, partition: parameters}
horovod: {controller: gloo, fusion_threshold_mb: 64, cycle_time_ms: 1, compression: none,
          op: average}
tf: {communication: ring}
launch: {launcher: deepspeed, np: 8, hosts: ["node1:4", "node2:4"]}
checkpoint: {dir: ckpt, every_steps: 100, keep: 3}
"""


def issues_of(data: object) -> list[str]:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict(data)
    return [issue.path for issue in caught.value.issues]


def test_design_example_loads_and_derives_accumulation(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(DESIGN_SPEC)
    spec = load_spec(path)
    assert spec.zero.stage == 2
    assert spec.world_size == 8
    assert spec.batch_for() == ResolvedBatch(global_=256, micro=16, accumulation=2, dp=8)
    assert [host.entry() for host in spec.hosts] == ["node1:4", "node2:4"]


def test_json_and_yaml_load_the_same(tmp_path: Path) -> None:
    yaml_path = tmp_path / "a.yaml"
    yaml_path.write_text(DESIGN_SPEC)
    json_path = tmp_path / "a.json"
    json_path.write_text(json.dumps(load_spec(yaml_path).to_dict()))
    assert load_spec(json_path) == load_spec(yaml_path)


def test_defaults_resolve_from_backend() -> None:
    assert TrainSpec().launcher == "torchrun"
    tf = TrainSpec(backend="tf")
    assert (tf.framework_name, tf.launcher) == ("tensorflow", "local")
    assert TrainSpec(backend="horovod").launcher == "horovodrun"
    assert TrainSpec().world_size == 1
    assert TrainSpec().master_addr == "127.0.0.1"


def test_to_dict_round_trips_and_dumps_yaml(tmp_path: Path) -> None:
    spec = TrainSpec.from_dict(
        {"backend": "deepspeed", "batch": {"micro": 2}, "launch": {"np": 4, "env": {"A": 1}}}
    )
    assert spec.launch.env == {"A": "1"}
    assert TrainSpec.from_dict(spec.to_dict()) == spec
    path = tmp_path / "spec.yaml"
    path.write_text(dump_spec(spec))
    assert load_spec(path) == spec


@pytest.mark.parametrize(
    ("batch", "world", "stages", "expected"),
    [
        ({"global": 256, "micro": 16}, 8, 1, (256, 16, 2, 8)),
        ({"global": 256, "accumulation": 4}, 8, 1, (256, 8, 4, 8)),
        ({"micro": 4, "accumulation": 2}, 8, 2, (32, 4, 2, 4)),
        ({"global": 64}, 8, 1, (64, 8, 1, 8)),
        ({"micro": 3}, 2, 1, (6, 3, 1, 2)),
        ({}, 4, 2, (2, 1, 1, 2)),
        ({"global": 32, "micro": 4, "accumulation": 2}, 8, 2, (32, 4, 2, 4)),
    ],
)
def test_batch_triple(
    batch: dict[str, int], world: int, stages: int, expected: tuple[int, ...]
) -> None:
    spec = TrainSpec.from_dict(
        {
            "backend": "deepspeed",
            "batch": batch,
            "parallel": {"pipeline": stages},
            "launch": {"np": world},
        }
    )
    resolved = spec.batch_for()
    assert (resolved.global_, resolved.micro, resolved.accumulation, resolved.dp) == expected
    assert resolved.global_ == resolved.micro * resolved.accumulation * resolved.dp


def test_inconsistent_triple_names_all_three_and_the_world() -> None:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict(
            {"batch": {"global": 250, "micro": 16, "accumulation": 2}, "launch": {"np": 8}}
        )
    line = caught.value.one_line()
    assert line.startswith(
        "spec error: batch.global=250: must equal micro(16) \u00d7 accumulation(2) "
        "\u00d7 data-parallel ranks(8) = 256"
    )
    assert "world size 8" in line and "HINT:" in line


def test_batch_for_other_world_sizes_raises_spec_error() -> None:
    spec = TrainSpec.from_dict({"batch": {"global": 16, "micro": 4}, "launch": {"np": 2}})
    assert spec.batch_for(4).accumulation == 1
    with pytest.raises(SpecError, match=r"batch\.global=16"):
        spec.batch_for(8)
    with pytest.raises(SpecError, match=r"parallel\.pipeline=3"):
        TrainSpec.from_dict(
            {"backend": "deepspeed", "parallel": {"pipeline": 3}, "launch": {"np": 4}}
        )


def test_all_issues_come_back_together_in_one_line() -> None:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict(
            {
                "batch": {"global": 250, "micro": 16, "accumulation": 2},
                "launch": {"np": 8},
                "optimizer": {"name": "lamb", "lr": -1},
                "zero": {"stage": 2},
                "unknown": 1,
            }
        )
    error = caught.value
    assert isinstance(error, ToolkitError)
    paths = [issue.path for issue in error.issues]
    # In the order the sections were written.
    assert paths == ["batch.global", "optimizer.name", "optimizer.lr", "zero.stage", "unknown"]
    line = error.one_line()
    assert "\n" not in line
    assert "optimizer.name='lamb': allowed sgd, adam, adamw" in line
    assert line.count("; ") >= 4


def test_unknown_keys_get_a_did_you_mean() -> None:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict({"optimizer": {"learning_rate": 0.1, "lr": 0.1, "wieght_decay": 0}})
    hints = {issue.path: issue.hint for issue in caught.value.issues}
    assert hints["optimizer.wieght_decay"] == "did you mean 'weight_decay'?"
    assert "optimizer.learning_rate" in hints


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"zero": {"stage": True}}, "zero.stage"),  # bool is not the stage 1
        ({"seed": "42"}, "seed"),
        ({"seed": -1}, "seed"),
        ({"optimizer": {"betas": [0.9]}}, "optimizer.betas"),
        ({"optimizer": {"betas": [0.9, 1.0]}}, "optimizer.betas[1]"),
        ({"clip_grad_norm": float("nan")}, "clip_grad_norm"),
        ({"precision": "FP16"}, "precision"),
        ({"launch": {"hosts": "node1:4"}}, "launch.hosts"),
        ({"launch": {"hosts": ["node1;reboot:4"]}}, "launch.hosts[0]"),
        ({"launch": {"hosts": ["$(touch x):1"]}}, "launch.hosts[0]"),
        ({"launch": {"hosts": ["node1:0"]}}, "launch.hosts[0]"),
        ({"launch": {"hosts": ["a:1", "a:2"]}}, "launch.hosts[1]"),
        ({"launch": {"master_addr": "a b"}}, "launch.master_addr"),
        ({"launch": {"job_name": "My_Job"}}, "launch.job_name"),
        ({"launch": {"time_limit": 3600}}, "launch.time_limit"),
        ({"launch": {"env": {"BAD-NAME": "x"}}}, "launch.env.BAD-NAME"),
        ({"pipeline": {"partition": "type:("}}, "pipeline.partition"),
        ({"optimizer": {"name": "adam", "momentum": 0.9}}, "optimizer.momentum"),
        ({"optimizer": {"name": "sgd", "nesterov": True}}, "optimizer.nesterov"),
        ({"backend": "tf", "framework": "torch"}, "framework"),
        ({"backend": "horovod", "launch": {"launcher": "deepspeed"}}, "launch.launcher"),
        (
            {
                "backend": "horovod",
                "launch": {"launcher": "mpirun"},
                "horovod": {"controller": "gloo"},
            },
            "horovod.controller",
        ),
        (
            {"backend": "deepspeed", "zero": {"stage": 2, "offload_params": "cpu"}},
            "zero.offload_params",
        ),
        (
            {"backend": "deepspeed", "zero": {"stage": 3, "offload_params": "nvme"}},
            "zero.nvme_path",
        ),
        (
            {
                "backend": "deepspeed",
                "optimizer": {"name": "sgd"},
                "zero": {"stage": 2, "offload_optimizer": "cpu"},
            },
            "zero.offload_optimizer",
        ),
        (
            {
                "backend": "deepspeed",
                "zero": {"stage": 2},
                "parallel": {"pipeline": 2},
                "launch": {"np": 2},
            },
            "zero.stage",
        ),
        ({"backend": "deepspeed", "zero": {"compute_grad_norm": False}}, "zero.compute_grad_norm"),
        (
            {
                "backend": "deepspeed",
                "clip_grad_norm": 1.0,
                "zero": {"stage": 2, "compute_grad_norm": False},
            },
            "zero.compute_grad_norm",
        ),
        (
            {
                "backend": "deepspeed",
                "optimizer": {"name": "adam"},
                "zero": {"stage": 2, "offload_optimizer": "cpu", "compute_grad_norm": False},
            },
            "zero.compute_grad_norm",
        ),
        (
            {
                "backend": "deepspeed",
                "precision": "bf16",
                "zero": {"stage": 1, "compute_grad_norm": False},
                "deepspeed": {"grad_accum_dtype": "fp32"},
            },
            "zero.compute_grad_norm",
        ),
        ({"launch": {"launcher": "torchrun", "hosts": ["a:2", "b:1"]}}, "launch.hosts"),
        ({"launch": {"launcher": "torchrun", "np": 3, "hosts": ["a:2"]}}, "launch.np"),
        ({"launch": {"hostfile": "missing-hostfile"}}, "launch.hostfile"),
        ([1, 2], "spec"),
    ],
)
def test_each_bad_field_is_named(data: object, path: str) -> None:
    assert path in issues_of(data)


def test_hostfile_is_read_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("# cluster\nnode1 slots=4\nnode2:4\n\n")
    (tmp_path / "train.yaml").write_text("backend: deepspeed\nlaunch: {hostfile: hosts}\n")
    spec = load_spec(tmp_path / "train.yaml")
    assert spec.launch.hosts == ("node1:4", "node2:4")
    assert spec.world_size == 8


def test_bad_hostfile_lines_are_spec_errors(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("node1 slots=4\nnode2; rm -rf / slots=2\nnode3 slots=x\n")
    (tmp_path / "train.yaml").write_text("launch: {hostfile: hosts}\n")
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "train.yaml")
    assert [i.path for i in caught.value.issues] == ["launch.hostfile:2", "launch.hostfile:3"]


def test_files_that_do_not_parse_are_spec_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("batch: {global: [\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(tmp_path / "bad.yaml")
    with pytest.raises(SpecError, match="cannot open the spec"):
        load_spec(tmp_path / "missing.yaml")


def test_python_built_specs_are_validated_too() -> None:
    spec = TrainSpec(
        backend="deepspeed",
        batch=BatchSpec(micro=4, accumulation=2),
        optimizer=OptimizerSpec(name="sgd", lr=0.1, momentum=0.9),
        zero=ZeroSpec(stage=1),
        launch=LaunchSpec(np=2),
    )
    assert spec.batch_for().global_ == 16
    with pytest.raises(SpecError) as caught:
        TrainSpec(seed="x", optimizer={"lr": 0}, launch=LaunchSpec(np=2, hosts=("a:1",)))  # type: ignore[arg-type]
    assert [i.path for i in caught.value.issues] == ["seed", "optimizer.lr", "launch.np"]
    with pytest.raises(SpecError) as caught:
        OptimizerSpec(lr=0, momentum="0.9")  # type: ignore[arg-type]
    assert [i.path for i in caught.value.issues] == ["lr", "momentum"]


def test_linear_lr_scaling_multiplies_by_data_parallel_ranks() -> None:
    spec = TrainSpec.from_dict(
        {"lr_scaling": "linear", "optimizer": {"lr": 0.1}, "launch": {"np": 4}}
    )
    assert spec.effective_lr() == pytest.approx(0.4)
    assert spec.effective_lr(8) == pytest.approx(0.8)


def test_horovod_controller_follows_the_launcher_unless_written() -> None:
    under_mpirun = TrainSpec.from_dict({"backend": "horovod", "launch": {"launcher": "mpirun"}})
    assert under_mpirun.horovod.controller == "mpi"
    assert under_mpirun.to_dict()["horovod"]["controller"] is None  # what the user wrote
    assert TrainSpec.from_dict(under_mpirun.to_dict()) == under_mpirun
    assert TrainSpec(backend="horovod").horovod.controller == "gloo"  # horovodrun's default
    written = {"backend": "horovod", "horovod": {"controller": "mpi"}}
    assert TrainSpec.from_dict(written).horovod.controller == "mpi"  # horovodrun --mpi
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict(
            {**written, "horovod": {"controller": "gloo"}, "launch": {"launcher": "mpirun"}}
        )
    assert "horovod.controller='gloo'" in caught.value.one_line()


def test_world_size_checks_wait_for_the_launcher_when_the_spec_leaves_it_open() -> None:
    pipeline = {"backend": "deepspeed", "parallel": {"pipeline": 2}, "batch": {"global": 8}}
    spec = TrainSpec.from_dict(pipeline)  # deepspeed --num_gpus 2 decides the world
    assert spec.fixed_world_size is None
    assert spec.batch_for(2) == ResolvedBatch(global_=8, micro=8, accumulation=1, dp=1)
    with pytest.raises(SpecError) as at_start:
        spec.batch_for(3)
    with pytest.raises(SpecError) as at_load:
        TrainSpec.from_dict({**pipeline, "launch": {"np": 3}})
    assert at_start.value.one_line() == at_load.value.one_line()
    divide = "parallel.pipeline=2: pipeline(2) x tensor(1) = 2 must divide the world size (3)"
    assert divide in at_load.value.one_line()


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"backend": "tf", "tf": {"port": 65535}, "launch": {"np": 2}}, "tf.port"),
        ({"backend": "tf", "tf": {"port": 65534}, "launch": {"hosts": ["localhost:3"]}}, "tf.port"),
    ],
)
def test_port_ranges_end_at_65535(data: dict[str, object], path: str) -> None:
    assert issues_of(data) == [path]
    ddp = {"backend": "ddp", "tf": {"port": 65535}, "launch": {"np": 2}}
    assert TrainSpec.from_dict(ddp).tf.port == 65535  # ddp does not use tf.port


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("ddp", "allreduce"),
        ("deepspeed", "allreduce"),
        ("deepspeed", "send_recv"),
        ("launch", "malloc"),
    ],
)
def test_removed_transport_and_allocator_keys_are_refused_with_what_replaced_them(
    section: str, key: str
) -> None:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict({"backend": "deepspeed", section: {key: "auto"}})
    line = caught.value.one_line()
    assert f"{section}.{key}=" in line and "no longer has" in line, line
    assert "HINT: remove it: " in line, line
