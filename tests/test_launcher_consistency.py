"""Every (backend, framework) × launcher pair is accepted or refused alike by the four places
that judge it: `toolkit spec check`, `toolkit launch --dry-run`, `toolkit config sbatch`, and
`toolkit.init`'s check of the environment that launcher gives a rank. A refusal carries the
same words everywhere (the engine table's).

The first three run through the real CLI (in process); the fourth detects the environment from
the variables the launcher's own plan gives rank 1, as a rank would see them.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from toolkit import engines
from toolkit.backends.registry import check_environment
from toolkit.cli import main
from toolkit.errors import ToolkitError
from toolkit.launch.environment import detect_environment
from toolkit.render.launchers import RUNTIME, LaunchContext, launch_plan
from toolkit.spec import TrainSpec

PAIRS = list(itertools.product(engines.ENGINES, engines.LAUNCHERS))
CONTEXT = LaunchContext(uid=1000, cpu_count=2, python="python")
# What a launcher fills in at run time, for the detection below.
RUNTIME_VALUES = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def spec_data(entry: engines.Engine, launcher: str) -> dict[str, object]:
    data: dict[str, object] = {
        "backend": entry.backend,
        "framework": entry.framework,
        "launch": {"launcher": launcher, "np": 2},
    }
    if entry.backend == "horovod":
        mpi = launcher in engines.MPI_LAUNCHERS
        data["horovod"] = {"controller": "mpi" if mpi else "gloo"}
    return data


def rank_environment(launcher: str) -> dict[str, str]:
    """The variables rank 1 of a 2-rank job under `launcher` sees, from an engine it starts."""
    entry = next(e for e in engines.ENGINES if launcher in e.launchers)
    plan = launch_plan(TrainSpec.from_dict(spec_data(entry, launcher)), ["train.py"], CONTEXT)
    env = plan.ranks[1].env
    return {
        name: RUNTIME_VALUES.get(name, "1") if value == RUNTIME else value
        for name, value in env.items()
    }


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    _, err = capsys.readouterr()
    return code, err.strip()


@pytest.mark.parametrize(("entry", "launcher"), PAIRS, ids=lambda v: getattr(v, "name", v))
def test_four_judges_agree(
    entry: engines.Engine, launcher: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec_data(entry, launcher)))
    check = cli(["spec", "check", str(spec_file)], capsys)
    dry_run = cli(["launch", "--spec", str(spec_file), "--dry-run", "--", "train.py"], capsys)
    sbatch = cli(["config", "sbatch", "--spec", str(spec_file), "--", "train.py"], capsys)

    environment = detect_environment(rank_environment(launcher), [])
    try:
        check_environment(entry.backend, entry.framework, environment.launcher)
        runtime = (0, "")
    except ToolkitError as error:
        runtime = (2, error.one_line())

    refusal = engines.launcher_refusal(entry.backend, entry.framework, launcher)
    outcomes = {
        "spec check": check,
        "launch --dry-run": dry_run,
        "config sbatch": sbatch,
        "init": runtime,
    }
    if refusal is None:
        assert all(code == 0 for code, _ in outcomes.values()), outcomes
    else:
        for judge, (code, message) in outcomes.items():
            assert code == 2, f"{judge} accepted {entry.name} under {launcher}"
            assert refusal in message, f"{judge}: {message!r} lacks {refusal!r}"
