"""The tested versions are named alike everywhere: scripts/setup.sh's defaults, the Dockerfile's
ARGs and constraints.txt agree, and every range in pyproject.toml's extras admits them. Also the
image's build context and the package's data files: what the build reads and what it ships."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup.sh"
PINNED = ("TORCH_VERSION", "TF_VERSION", "DEEPSPEED_VERSION", "MPI4PY_VERSION", "HOROVOD_VERSION")


def assignments(text: str, pattern: str) -> dict[str, str]:
    return dict(re.findall(pattern, text, flags=re.MULTILINE))


def setup_text() -> str:
    return SETUP.read_text()


def sourced_scripts() -> list[str]:
    """The scripts setup.sh sources, relative to the repository."""
    return re.findall(r'^source "\$ROOT/(scripts/\S+)"$', setup_text(), flags=re.MULTILINE)


def setup_pins() -> dict[str, str]:
    return {
        k: v
        for k, v in assignments(setup_text(), r'^(\w+_VERSION)="\$\{\w+:-(\S+)\}"$').items()
        if k in PINNED
    }


def installed_by_setup() -> dict[str, str]:
    """Each package setup.sh and the scripts it sources install as NAME==$VARIABLE: name to
    variable (`tensorflow[and-cuda]==$TF_VERSION` names tensorflow)."""
    texts = [setup_text(), *((ROOT / script).read_text() for script in sourced_scripts())]
    found: dict[str, str] = {}
    for text in texts:
        pattern = r"(?<![\w\\-])([A-Za-z][\w.-]*)(?:\[[\w,-]+\])?==\$\{?(\w+_VERSION)\b"
        for name, variable in re.findall(pattern, text):
            assert found.setdefault(canonicalize_name(name), variable) == variable, name
    return found


def constraints() -> dict[str, Requirement]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    requirements = [Requirement(line) for line in lines if line.strip() and line[0] != "#"]
    by_name = {canonicalize_name(r.name): r for r in requirements}
    assert len(by_name) == len(requirements), "a package named twice in constraints.txt"
    return by_name


def exact_version(requirement: Requirement) -> str:
    (specifier,) = requirement.specifier
    return specifier.version


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def extras() -> dict[str, list[Requirement]]:
    table = pyproject()["project"]["optional-dependencies"]
    return {extra: [Requirement(line) for line in lines] for extra, lines in table.items()}


def test_setup_script_pins_every_engine() -> None:
    assert set(setup_pins()) == set(PINNED)


def test_dockerfile_pins_match_setup_script() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    docker_pins = assignments(dockerfile, r"^ARG (\w+_VERSION)=(\S+)$")
    assert docker_pins == setup_pins()


def test_every_constraint_is_one_exact_version() -> None:
    """pip refuses extras in a constraints file; a range there would not say what was tested."""
    for name, requirement in constraints().items():
        assert not requirement.extras and requirement.marker is None and not requirement.url, name
        (specifier,) = requirement.specifier
        assert specifier.operator == "==" and "*" not in specifier.version, name


def test_constraints_match_what_setup_installs() -> None:
    defaults = setup_pins()
    installed = installed_by_setup()
    assert set(installed.values()) == set(PINNED), installed
    pinned = constraints()
    for name, variable in installed.items():
        assert name in pinned, f"{name} (setup.sh's ${variable}) is not in constraints.txt"
        assert exact_version(pinned[name]) == defaults[variable], name


def test_setup_rewrites_the_constraint_of_every_overridable_version() -> None:
    """An overridden TORCH_VERSION etc. replaces its line of the constraints pip installs through,
    so -c never fights the variable; and every install in setup.sh goes through them."""
    text = setup_text()
    for variable in PINNED:
        assert re.search(rf'-e "s/\^[^"]*==\${variable}/"', text), variable
    assert '"$ROOT/constraints.txt" >"$CONSTRAINTS"' in text
    pip_install = re.search(r"^pip_install\(\) \{\n(.*?)^\}", text, flags=re.MULTILINE | re.DOTALL)
    assert pip_install and '-c "$CONSTRAINTS"' in pip_install.group(1)
    code = text.replace(pip_install.group(0), "").splitlines()
    outside = [line for line in code if "pip install" in line and not line.lstrip().startswith("#")]
    assert not outside, outside


def test_every_constraint_is_installed_somewhere() -> None:
    """No stale line: each constrained package is in an extra or installed by setup.sh."""
    named = {canonicalize_name(r.name) for reqs in extras().values() for r in reqs}
    stale = set(constraints()) - named - set(installed_by_setup())
    assert not stale, stale


def test_extras_are_ranges_that_admit_the_tested_versions() -> None:
    pinned = constraints()
    core = [Requirement(line) for line in pyproject()["project"]["dependencies"]]
    checked = set()
    for extra, requirements in {**extras(), "dependencies": core}.items():
        for requirement in requirements:
            name = canonicalize_name(requirement.name)
            operators = {specifier.operator for specifier in requirement.specifier}
            assert not operators & {"==", "==="}, f"{extra}: {requirement} is a pin, not a range"
            if name in pinned:
                version = exact_version(pinned[name])
                assert requirement.specifier.contains(version), f"{extra}: {requirement} {version}"
                checked.add(name)
    assert {"torch", "tensorflow", "deepspeed", "horovod", "mpi4py", "transformers"} <= checked


def test_setup_refuses_an_old_python_before_anything_installs() -> None:
    text = setup_text()
    check = re.search(r"sys\.version_info < \((\d+), (\d+)\)", text)
    assert check, "setup.sh checks no Python version"
    major, minor = int(check.group(1)), int(check.group(2))
    requires = SpecifierSet(pyproject()["project"]["requires-python"])
    assert f"{major}.{minor}" in requires and f"{major}.{minor - 1}" not in requires
    first_install = min(text.index("\napt_ensure "), text.index("\npip_install "))
    assert check.start() < first_install


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


def first_setup_index(instructions: list[tuple[str, str]]) -> int:
    return next(
        i
        for i, (name, arguments) in enumerate(instructions)
        if name == "RUN" and "bash scripts/setup.sh" in arguments
    )


def test_default_build_is_the_cuda_image_on_plain_debian() -> None:
    """CUDA comes from the registry's NVIDIA packages (setup.sh), not from a CUDA base image: the
    default base is the Debian release that scripts/build_image.sh makes locally, and the default
    device is cuda (test_device_argument_reaches_the_setup_script_and_defaults_to_cuda)."""
    assert base_image({}) == "debian:bookworm"
    build_script = (ROOT / "scripts" / "build_image.sh").read_text()
    assert "localhost/debian-base:bookworm" in build_script
    assert "mmdebstrap" in build_script and " bookworm - " in build_script


def test_the_build_reads_no_pip_configuration_but_the_one_it_is_given() -> None:
    """pip reads no configuration file when PIP_CONFIG_FILE is os.devnull: a build machine's pip
    configuration (which may name files the build does not see) never reaches the RUN steps
    unless it is passed in. The ARG comes after FROM, or RUN steps would not see it."""
    instructions = dockerfile_instructions()
    after_from = instructions[first_from_index(instructions) + 1 : first_setup_index(instructions)]
    assert ("ARG", "PIP_CONFIG_FILE=/dev/null") in after_from
    build_script = (ROOT / "scripts" / "build_image.sh").read_text()
    assert "PIP_CONFIG_FILE=" in build_script
    assert "/etc/xdg/pip" not in build_script and "/etc/pip.conf" not in build_script


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


def test_no_env_step_expands_an_argument_before_the_first_run_step() -> None:
    """podman 4.3's layer cache keys an ENV step by its text, not by the build arguments it
    expands: before any RUN step (whose key includes them) both variants share one ENV layer,
    and the second build takes the first one's TOOLKIT_DEVICE."""
    instructions = dockerfile_instructions()
    start = first_from_index(instructions) + 1
    first_run = next(i for i, (name, _) in enumerate(instructions) if name == "RUN")
    arguments = {
        arguments.partition("=")[0] for name, arguments in instructions[start:] if name == "ARG"
    }
    for name, text in instructions[start:first_run]:
        if name == "ENV":
            expanded = set(re.findall(r"\$\{?(\w+)\}?", text)) & arguments
            assert not expanded, f"ENV {text} expands {expanded} before the first RUN step"


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
    first_setup = first_setup_index(instructions)
    assert first_setup < copy_all
    assert "TOOLKIT_INSTALL_SELF=0" in instructions[first_setup][1].split()
    assert "TOOLKIT_INSTALL_SELF" in setup_text()


def test_the_engines_layer_copies_every_file_setup_reads() -> None:
    """The image's first setup.sh run sees only the files copied before it, each where it lies in
    the repository; a script setup.sh sources, or constraints.txt, left out fails the build."""
    sourced = sourced_scripts()
    assert {"scripts/build_horovod.sh", "scripts/build_deepspeed.sh"} <= set(sourced)
    instructions = dockerfile_instructions()
    copied = set()
    for name, arguments in instructions[: first_setup_index(instructions)]:
        if name == "COPY":
            *sources, destination = arguments.split()
            assert destination.startswith("/opt/toolkit/"), destination
            for source in sources:
                into_folder = destination.endswith("/")
                target = destination + Path(source).name if into_folder else destination
                assert target == f"/opt/toolkit/{source}", (source, destination)
                copied.add(source)
    assert copied == {"scripts/setup.sh", "constraints.txt", *sourced}


def test_the_build_context_holds_what_setup_and_the_package_build_read() -> None:
    """.dockerignore leaves out everything not named: constraints.txt (setup.sh) and the readme
    and license file (the package build, at `COPY . /opt/toolkit`) must be named."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in lines, "the context is no longer a list of what goes in"
    project = pyproject()["project"]
    needed = {"constraints.txt", project["readme"], project["license"]["file"]}
    for path in needed:
        assert (ROOT / path).is_file(), path
        assert f"!{path}" in lines, path


def test_the_package_ships_its_data_files() -> None:
    """py.typed, and any other file in toolkit/ that is not Python, is package data."""
    patterns = pyproject()["tool"]["setuptools"]["package-data"]["toolkit"]
    package = ROOT / "toolkit"
    data = [
        path.relative_to(package).as_posix()
        for path in package.rglob("*")
        if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts
    ]
    assert "py.typed" in data
    unshipped = [p for p in data if not any(fnmatch.fnmatch(p, pat) for pat in patterns)]
    assert not unshipped, unshipped
