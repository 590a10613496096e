"""The engine table is the only place that knows which engine runs where.

Every other module asks `toolkit.engines`; a comparison against an engine (backend) or launcher
name anywhere else (outside each engine's own backend package) fails this test. Frameworks are
not engines: code that holds a torch and a Keras implementation of one thing (the parity
references) may choose between them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from toolkit import engines

ROOT = Path(__file__).resolve().parents[1] / "toolkit"
NAMES = set(engines.BACKENDS) | set(engines.LAUNCHERS)
# A backend package may name its own engine (and the launchers it special-cases) freely.
OWN_PACKAGES = (
    "backends/ddp",
    "backends/deepspeed",
    "backends/horovod",
    "backends/tf",
    "backends/mpi",
)


def _names_in(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(element) for element in node.elts)) if node.elts else set()
    return set()


def _branches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = set().union(*(_names_in(side) for side in [node.left, *node.comparators]))
            if names:
                found.append(
                    f"{path.relative_to(ROOT.parent)}:{node.lineno} compares with {sorted(names)}"
                )
    return found


def test_no_engine_or_launcher_name_is_branched_on_outside_the_table() -> None:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "engines.py" or relative.startswith(OWN_PACKAGES):
            continue
        offenders += _branches(path)
    assert not offenders, "branch on an engine name outside toolkit/engines.py:\n" + "\n".join(
        offenders
    )


def test_the_check_finds_a_branch(tmp_path: Path) -> None:
    """The scan above is not vacuous: it sees the forms a branch takes."""
    sample = tmp_path / "sample.py"
    sample.write_text('if a == "horovod" or b in ("mpirun", "srun") or "tf" != c:\n    pass\n')
    assert len(_branches_at(sample)) == 3


def _branches_at(path: Path) -> list[ast.Compare]:
    tree = ast.parse(path.read_text())
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and set().union(*(_names_in(side) for side in [node.left, *node.comparators]))
    ]


@pytest.mark.parametrize("entry", engines.ENGINES, ids=lambda e: e.name)
def test_every_engine_runs_under_its_implied_launcher(entry: engines.Engine) -> None:
    assert engines.launcher_refusal(entry.backend, entry.framework, entry.implied_launcher) is None
    own_environment = engines.LAUNCHER_ENVIRONMENTS[entry.implied_launcher][0]
    assert engines.environment_refusal(entry.backend, entry.framework, own_environment) is None


def test_every_environment_a_launcher_produces_is_accepted_by_its_engines() -> None:
    for entry in engines.ENGINES:
        for launcher in entry.launchers:
            for environment in engines.LAUNCHER_ENVIRONMENTS[launcher]:
                assert environment in entry.environments, (entry.name, launcher, environment)


def test_unknown_pair_is_refused() -> None:
    with pytest.raises(engines.UnknownEngine, match="supported: ddp\\+torch"):
        engines.engine("ddp", "tensorflow")
