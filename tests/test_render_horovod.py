"""Horovod settings, checked with Horovod's own horovodrun parser and config-file reader."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from toolkit.render import horovod
from toolkit.spec import TrainSpec

SPEC = TrainSpec.from_dict(
    {
        "backend": "horovod",
        "batch": {"global": 64, "micro": 8},
        "horovod": {
            "controller": "gloo",
            "fusion_threshold_mb": 32,
            "cycle_time_ms": 2.5,
            "cache_capacity": 512,
            "hierarchical_allreduce": True,
            "compression": "fp16",
            "op": "adasum",
            "timeline": "timeline.json",
        },
        "launch": {"np": 4},
    }
)


def test_environment_uses_bytes_and_flags() -> None:
    env = horovod.environment(SPEC)
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert env["HOROVOD_CYCLE_TIME"] == "2.5"
    assert env["HOROVOD_CONTROLLER"] == "gloo"
    assert env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"
    assert env["HOROVOD_TIMELINE"] == "timeline.json"


@pytest.mark.parametrize(
    ("horovod_section", "launcher", "cycle", "fusion_mib"),
    [
        ({}, "horovodrun", "5.0", 64),  # the Gloo controller horovodrun implies
        ({"controller": "mpi"}, "horovodrun", "1.0", 1),
        ({}, "mpirun", "1.0", 1),  # MPI's controller
        ({"controller": "gloo", "cycle_time_ms": 0.5}, "horovodrun", "0.5", 64),
        ({"controller": "mpi", "fusion_threshold_mb": 128}, "horovodrun", "1.0", 128),
        ({"fusion_threshold_mb": 0}, "mpirun", "1.0", 0),  # fusion off
    ],
)
def test_an_unset_cycle_time_or_fusion_buffer_follows_the_controller(
    horovod_section: dict[str, object], launcher: str, cycle: str, fusion_mib: int
) -> None:
    spec = TrainSpec.from_dict(
        {"backend": "horovod", "horovod": horovod_section, "launch": {"launcher": launcher}}
    )
    env = horovod.environment(spec)
    assert env["HOROVOD_CYCLE_TIME"] == cycle
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(fusion_mib * 1024 * 1024)
    flags = horovod.horovodrun_flags(spec)
    assert flags[flags.index("--cycle-time-ms") + 1] == cycle
    assert flags[flags.index("--fusion-threshold-mb") + 1] == str(fusion_mib)
    params = horovod.config_file(spec)["params"]
    assert params["cycle_time_ms"] == float(cycle)
    assert params["fusion_threshold_mb"] == fusion_mib


@pytest.mark.parametrize(
    ("horovod_section", "launcher", "value"),
    [
        ({}, "mpirun", "1"),  # yield by default under the MPI controller
        ({"mpi_yield_when_idle": False}, "mpirun", "0"),  # Open MPI's own, written out
        ({"controller": "mpi"}, "horovodrun", "1"),
        ({}, "horovodrun", None),  # the Gloo controller waits in no MPI call
    ],
)
def test_open_mpi_yields_under_the_mpi_controller(
    horovod_section: dict[str, object], launcher: str, value: str | None
) -> None:
    spec = TrainSpec.from_dict(
        {"backend": "horovod", "horovod": horovod_section, "launch": {"launcher": launcher}}
    )
    assert horovod.environment(spec).get("OMPI_MCA_mpi_yield_when_idle") == value


def test_optimizer_options_carry_compression_op_and_accumulation() -> None:
    assert horovod.optimizer_options(SPEC) == {
        "compression": "Compression.fp16",
        "op": "Adasum",
        "backward_passes_per_step": 2,
        "gradient_predivide_factor": 1.0,
    }


def test_horovodrun_reads_our_flags_and_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = pytest.importorskip("horovod.runner.launch")
    config_parser = pytest.importorskip("horovod.runner.common.util.config_parser")

    argv = ["horovodrun", "-np", "4", *horovod.horovodrun_flags(SPEC), "python", "t.py"]
    monkeypatch.setattr(sys, "argv", argv)
    args = launch.parse_args()
    env: dict[str, str] = {}
    config_parser.set_env_from_args(env, args)
    ours = horovod.environment(SPEC)
    assert {key: ours[key] for key in env} == env
    assert args.use_gloo and args.command == ["python", "t.py"]

    path = tmp_path / "horovod.yaml"
    path.write_text(yaml.safe_dump(horovod.config_file(SPEC)))
    monkeypatch.setattr(sys, "argv", ["horovodrun", "-np", "4", "--config-file", str(path), "x"])
    from_file = launch.parse_args()
    env_from_file: dict[str, str] = {}
    config_parser.set_env_from_args(env_from_file, from_file)
    assert env_from_file == env
    assert from_file.use_gloo
