"""How every benchmark starts its rank programs: under the spec's own launcher, as a real job
(toolkit.render + toolkit.launch), quietly, with a time limit; and how it says a launch failed."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.launch.runner import execute, launch_plan_here
from toolkit.launch.supervisor import LaunchResult
from toolkit.spec import TrainSpec


def launch(spec: TrainSpec, command: list[str], *, timeout: float) -> LaunchResult:
    """`command` (a program and its arguments) as the spec's launcher runs it."""
    return execute(launch_plan_here(spec, command), spec, timeout=timeout, echo=False)


def launch_with_spec(
    spec: TrainSpec, directory: Path, program: str, args: list[str], *, timeout: float
) -> LaunchResult:
    """`program --spec DIR/spec.json ARGS`: a rank program that starts the toolkit from `spec`."""
    spec_file = directory / "spec.json"
    spec_file.write_text(json.dumps(spec.to_dict()))
    return launch(spec, [program, "--spec", str(spec_file), *args], timeout=timeout)


def failure(outcome: LaunchResult, *, wrote: bool, missing: str) -> str | None:
    """Why a launch gave no results (its report, or `missing` when it ended well without
    writing them); None when it did."""
    if not outcome.ok:
        return outcome.report()
    return None if wrote else missing
