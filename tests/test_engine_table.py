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
from toolkit.bench.cases import Native, native_for
from toolkit.parity.cases import all_cases, framework_of
from toolkit.plan.table import plan_rule
from toolkit.spec import TrainSpec

ROOT = Path(__file__).resolve().parents[1] / "toolkit"
NAMES = set(engines.BACKENDS) | set(engines.LAUNCHERS)
# A backend package may name its own engine (and the launchers it special-cases) freely; the
# MPI package serves the launchers, not one engine.
OWN_PACKAGES = (*sorted({entry.package_dir for entry in engines.ENGINES}), "backends/mpi")


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


def _module_file(module: str) -> Path:
    return ROOT.parent / (module.replace(".", "/") + ".py")


def _defines(module: str, name: str) -> bool:
    tree = ast.parse(_module_file(module).read_text())
    return any(
        isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name for node in tree.body
    )


@pytest.mark.parametrize("entry", engines.ENGINES, ids=lambda e: e.name)
def test_every_engine_row_has_each_part(entry: engines.Engine) -> None:
    """One backend package and one row: the backend class, doctor probe, spec section, plan rule,
    bench native script and parity cases all hang off it. Checked without importing an engine."""
    module, _, name = entry.backend_class.partition(":")
    assert module.startswith(f"toolkit.{entry.package_dir.replace('/', '.')}."), module
    assert _defines(module, name), entry.backend_class
    assert _module_file(entry.probe).is_file(), entry.probe
    assert entry.spec_section in TrainSpec.model_fields, entry.spec_section
    assert callable(plan_rule(entry)), entry.plan_rule
    spec = TrainSpec.from_dict({"backend": entry.backend, "framework": entry.framework})
    native = native_for(spec)
    assert isinstance(native, Native) and native.path.is_file(), entry.bench_native
    cases = [c for c in all_cases() if (c.spec["backend"], framework_of(c.spec)) == entry.key]
    assert cases, f"no parity case runs {entry.name}"


def test_the_row_check_fails_on_a_missing_part() -> None:
    """The check above is not vacuous: a rule that does not exist is found."""
    entry = engines.ENGINES[0]
    missing = engines.Engine(**{**entry.__dict__, "plan_rule": "toolkit.plan.table:nothing"})
    with pytest.raises(AttributeError):
        plan_rule(missing)
    assert not _defines("toolkit.plan.table", "nothing")
