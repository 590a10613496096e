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


def dockerfile_instructions() -> list[tuple[str, str]]:
    """The Dockerfile as (INSTRUCTION, arguments) pairs, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    pairs = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, arguments = line.strip().partition(" ")
            pairs.append((instruction.upper(), " ".join(arguments.split())))
    return pairs


def base_image(build_args: dict[str, str]) -> str:
    """The image FROM names for these --build-arg values, as Docker resolves it: only ARGs
    declared before FROM are in scope there."""
    instructions = dockerfile_instructions()
    first_from = first_from_index(instructions)
    before_from = instructions[:first_from]
    scope = dict(arguments.partition("=")[::2] for name, arguments in before_from if name == "ARG")
    scope.update({key: value for key, value in build_args.items() if key in scope})
    return re.sub(r"\$\{?(\w+)\}?", lambda m: scope[m.group(1)], instructions[first_from][1])


def first_from_index(instructions: list[tuple[str, str]]) -> int:
    return next(i for i, (name, _) in enumerate(instructions) if name == "FROM")


def test_default_build_is_the_cuda_image() -> None:
    assert re.fullmatch(r"nvidia/cuda:\S+devel\S*", base_image({}))


def test_base_image_argument_selects_the_base() -> None:
    local = "localhost/debian-base:bookworm"
    assert base_image({"BASE_IMAGE": local}) == local


def test_device_argument_reaches_the_setup_script_and_defaults_to_cuda() -> None:
    instructions = dockerfile_instructions()
    after_from = instructions[first_from_index(instructions) + 1 :]
    # declared after FROM, or RUN steps would not see it
    assert ("ARG", "TOOLKIT_DEVICE=cuda") in after_from
    envs = " ".join(arguments for name, arguments in after_from if name == "ENV")
    assert "TOOLKIT_DEVICE=${TOOLKIT_DEVICE}" in envs.split()


def test_dockerfile_installs_through_the_setup_script() -> None:
    setup_runs = [
        arguments
        for name, arguments in dockerfile_instructions()
        if name == "RUN" and "bash scripts/setup.sh" in arguments
    ]
    assert setup_runs
    for run in setup_runs:  # the ARGs reach the script, so they are not decoration
        for variable in PINNED:
            assert f"{variable}=${variable}" in run.split()


def test_engines_layer_is_built_before_the_source_is_copied() -> None:
    """A change to the toolkit's code must not rebuild the engines: the first setup.sh run sees
    only the setup scripts and skips installing the toolkit itself."""
    instructions = dockerfile_instructions()
    copy_all = instructions.index(("COPY", ". /opt/toolkit"))
    first_setup = next(
        i
        for i, (name, arguments) in enumerate(instructions)
        if name == "RUN" and "bash scripts/setup.sh" in arguments
    )
    assert first_setup < copy_all
    assert "TOOLKIT_INSTALL_SELF=0" in instructions[first_setup][1].split()
    assert "TOOLKIT_INSTALL_SELF" in (ROOT / "scripts" / "setup.sh").read_text()


def test_the_engines_layer_copies_every_script_setup_sources() -> None:
    """The image's first setup.sh run sees only the scripts copied before it; a script setup.sh
    sources but the Dockerfile does not copy fails the image build."""
    sourced = re.findall(
        r'^source "\$ROOT/(scripts/\S+)"$',
        (ROOT / "scripts" / "setup.sh").read_text(),
        flags=re.MULTILINE,
    )
    assert {"scripts/build_horovod.sh", "scripts/build_deepspeed.sh"} <= set(sourced)
    first_copy = next(a for n, a in dockerfile_instructions() if n == "COPY")
    assert set(first_copy.split()[:-1]) == {"scripts/setup.sh", *sourced}
