"""`toolkit.load_spec()` with no argument finds the spec the script was started with, and
`toolkit launch` names it to every rank; `toolkit.script_args()` drops the deepspeed
launcher's --local_rank."""

from __future__ import annotations

from pathlib import Path

import pytest

import toolkit
from toolkit.cli import main
from toolkit.rank_variables import TOOLKIT_SPEC
from toolkit.spec import SpecError
from toolkit.spec.load import launched_spec_path

SPEC = str(Path(__file__).resolve().parent.parent / "hvd_examples" / "quickstart.yaml")


def test_the_scripts_own_spec_argument_comes_first() -> None:
    env = {TOOLKIT_SPEC: "/launched.yaml"}
    assert launched_spec_path(["--spec", "mine.yaml"], env) == "mine.yaml"
    assert launched_spec_path(["--epochs", "2", "--spec=mine.yaml"], env) == "mine.yaml"
    assert launched_spec_path(["--epochs", "2"], env) == "/launched.yaml"


def test_no_spec_anywhere_is_one_clear_error() -> None:
    with pytest.raises(SpecError) as caught:
        launched_spec_path([], {})
    line = caught.value.one_line()
    assert "no spec given" in line and "toolkit launch --spec FILE" in line, line


def test_load_spec_without_an_argument_reads_the_launched_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.argv", ["train.py"])
    monkeypatch.setenv(TOOLKIT_SPEC, SPEC)
    assert toolkit.load_spec() == toolkit.load_spec(SPEC)


def test_toolkit_launch_names_the_spec_to_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", "--spec", SPEC, "--dry-run", "--", "train.py"]) == 0
    plan = capsys.readouterr().out
    assert f"{TOOLKIT_SPEC}={SPEC}" in plan, plan


def test_script_args_drop_the_deepspeed_launchers_local_rank() -> None:
    assert toolkit.script_args(["--local_rank=1", "--epochs", "2"]) == ["--epochs", "2"]
    assert toolkit.script_args(["--epochs", "2", "--local_rank", "0"]) == ["--epochs", "2"]
