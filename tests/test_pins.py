"""The setup script, pyproject.toml and the Dockerfile name the same engine versions."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINNED = ("TORCH_VERSION", "TF_VERSION", "DEEPSPEED_VERSION", "MPI4PY_VERSION", "HOROVOD_VERSION")
PYPROJECT_NAMES = {
    "TORCH_VERSION": "torch",
    "TF_VERSION": "tensorflow-cpu",
    "DEEPSPEED_VERSION": "deepspeed",
    "MPI4PY_VERSION": "mpi4py",
    "HOROVOD_VERSION": "horovod",
}


def assignments(text: str, pattern: str) -> dict[str, str]:
    return dict(re.findall(pattern, text, flags=re.MULTILINE))


def setup_pins() -> dict[str, str]:
    text = (ROOT / "scripts" / "setup.sh").read_text()
    return {
        k: v
        for k, v in assignments(text, r'^(\w+_VERSION)="\$\{\w+:-(\S+)\}"$').items()
        if k in PINNED
    }


def pyproject_pins() -> dict[str, str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pins: dict[str, set[str]] = {}
    for requirements in extras.values():
        for requirement in requirements:
            name, _, version = requirement.partition("==")
            if version:
                pins.setdefault(name, set()).add(version)
    assert all(len(versions) == 1 for versions in pins.values()), pins
    return {name: versions.pop() for name, versions in pins.items()}


def test_setup_script_pins_every_engine() -> None:
    assert set(setup_pins()) == set(PINNED)


def test_dockerfile_pins_match_setup_script() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    docker_pins = assignments(dockerfile, r"^ARG (\w+_VERSION)=(\S+)$")
    assert docker_pins == setup_pins()


def test_pyproject_pins_match_setup_script() -> None:
    pyproject = pyproject_pins()
    for variable, version in setup_pins().items():
        assert pyproject[PYPROJECT_NAMES[variable]] == version, variable


def test_dockerfile_installs_through_the_setup_script_for_cuda() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "bash scripts/setup.sh" in dockerfile
    for variable in PINNED:  # the ARGs reach the script, so they are not decoration
        assert f"{variable}=${variable}" in dockerfile
    assert "TOOLKIT_DEVICE=cuda" in dockerfile
    assert re.search(r"^FROM nvidia/cuda:\S+devel", dockerfile, flags=re.MULTILINE)
