"""Horovod's controller when a spec names none: horovodrun's own rule on the launching machine,
and in each rank the controller its launcher started it for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from toolkit.backends.horovod.settings import export_environment
from toolkit.cli import main
from toolkit.launch import machine_settings
from toolkit.launch.detectors import LaunchEnvironment
from toolkit.spec import TrainSpec


def horovod_spec(**horovod: object) -> TrainSpec:
    return TrainSpec.from_dict({"backend": "horovod", "horovod": horovod, "launch": {"np": 2}})


@pytest.mark.parametrize("machine", ["mpi", "gloo"])
def test_an_unset_controller_under_horovodrun_is_the_machines(
    machine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine_settings, "horovodrun_controller", lambda: machine)
    resolved = machine_settings.for_this_machine(horovod_spec())
    assert resolved.launcher == "horovodrun" and resolved.horovod.controller == machine
    # The cycle time follows the controller in effect: Horovod's 1 ms under MPI, 5 under Gloo.
    assert resolved.horovod.cycle_time == (1.0 if machine == "mpi" else 5.0)
    assert resolved.horovod.controller_setting is None  # resolved, not written


def test_written_controllers_and_other_launchers_are_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def never() -> str:
        raise AssertionError("asked the machine for a setting the spec fixes")

    monkeypatch.setattr(machine_settings, "horovodrun_controller", never)
    for spec in (
        horovod_spec(controller="gloo"),
        TrainSpec.from_dict({"backend": "horovod", "launch": {"launcher": "mpirun"}}),
        TrainSpec.from_dict({"backend": "ddp"}),
    ):
        assert machine_settings.for_this_machine(spec) is spec


def test_this_machines_horovod_is_asked_once_per_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scripts/setup.sh builds Horovod with MPI and installs Open MPI, so horovodrun runs MPI
    here given no flag; the answer is cached under the build's identity."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert machine_settings.horovodrun_controller() == "mpi"
    cache = tmp_path / "toolkit" / machine_settings.CACHE_NAME
    assert cache.is_file()
    asked: list[bool] = []
    monkeypatch.setattr(machine_settings, "_ask_horovod", lambda: asked.append(True) or False)
    assert machine_settings.horovod_built_with_mpi() is True and asked == []  # the cache
    identity = machine_settings._build_identity()
    assert identity is not None
    monkeypatch.setattr(machine_settings, "_build_identity", lambda: [*identity, ["new.so", 1, 2]])
    assert machine_settings.horovod_built_with_mpi() is False and asked == [True]  # rebuilt


def _rank(launcher: str) -> LaunchEnvironment:
    return LaunchEnvironment(
        launcher=launcher, rank=0, local_rank=0, world_size=2, local_world_size=2, node_rank=0
    )


@pytest.mark.parametrize(
    ("launcher", "running"), [("horovodrun", "gloo"), ("openmpi", "mpi"), ("srun", "mpi")]
)
def test_a_rank_runs_the_controller_its_launcher_started_it_for(
    launcher: str,
    running: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """horovodrun's variables in a rank mean `horovodrun --gloo`; its MPI mode sets none."""
    other = "mpi" if running == "gloo" else "gloo"
    environ: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", environ)
    export_environment(horovod_spec(controller=other), _rank(launcher))
    assert environ["HOROVOD_CONTROLLER"] == environ["HOROVOD_CPU_OPERATIONS"] == running
    assert environ["HOROVOD_CYCLE_TIME"] == ("5.0" if running == "gloo" else "1.0")
    assert f"horovod.controller='{other}'" in capsys.readouterr().err
    environ.clear()
    export_environment(horovod_spec(), _rank(launcher))
    assert environ["HOROVOD_CONTROLLER"] == running
    assert capsys.readouterr().err == ""


def test_launch_and_config_render_this_machines_choice(capsys: pytest.CaptureFixture[str]) -> None:
    """What a user sees here for a spec without a controller: `horovodrun --mpi`, 1 ms cycles."""
    spec = str(Path(__file__).parent / "specs" / "horovod_controller_from_machine.yaml")
    assert main(["launch", "--spec", spec, "--dry-run", "--", "train.py"]) == 0
    printed = capsys.readouterr().out
    assert "--mpi" in printed.split() and "--gloo" not in printed.split()
    assert main(["config", "horovod", "--spec", spec]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["controller"] == "mpi" and config["params"]["cycle_time_ms"] == 1.0
