"""Settings a spec leaves unset whose best value depends on the machine that launches the job.

Horovod's controller under horovodrun. Given neither --gloo nor --mpi, horovodrun runs the MPI
controller when Horovod was built with MPI and Gloo only otherwise
(horovod/runner/launch.py, `run_controller`). The toolkit follows the same rule, so a spec that
does not name a controller runs as `horovodrun` alone would run it, and gets the faster MPI
controller wherever Horovod has it (docs/engine-notes.md, Horovod).

What Horovod was built with is asked of Horovod itself, as horovodrun asks it (a subprocess
that loads its extensions, seconds of work), and cached in ~/.cache/toolkit under the identity
of the extension files, so a rebuilt Horovod is asked again. The renderers stay pure: the
commands that launch or print a job on this machine resolve the spec first (`for_this_machine`),
and a rank takes its controller from the launcher that started it
(toolkit.backends.horovod.settings), never from this module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from toolkit import engines
from toolkit.cache import cache_directory
from toolkit.engines import Controller
from toolkit.launch.executables import find_launcher
from toolkit.spec import TrainSpec

MPI_BUILT_PROBE = "from horovod.common.util import mpi_built; print(int(bool(mpi_built())))"
PROBE_TIMEOUT_S = 120
CACHE_NAME = "horovod-build.json"


def for_this_machine(spec: TrainSpec) -> TrainSpec:
    """`spec` with its machine-dependent unset settings resolved for this machine: the
    controller of an engine that has a choice, under a launcher that leaves it one."""
    hvd = spec.horovod
    has_choice = engines.engine(spec.backend, spec.framework_name).controllers
    if not has_choice or len(engines.controllers_under(spec.launcher)) < 2:
        return spec
    if hvd.controller_setting is not None:
        return spec
    return spec.model_copy(update={"horovod": hvd.with_launcher(horovodrun_controller())})


def horovodrun_controller() -> Controller:
    """The controller horovodrun picks here when given none: mpi when this Horovod was built
    with MPI and an mpirun is installed (horovodrun runs MPI through it), else gloo."""
    if find_launcher("mpirun") is None:
        return "gloo"
    return "mpi" if horovod_built_with_mpi() else "gloo"


def horovod_built_with_mpi() -> bool:
    """Horovod's own answer (its `mpi_built`), cached per build; False without Horovod."""
    key = _build_identity()
    if key is None:
        return False
    cache = cache_directory() / CACHE_NAME
    try:
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return bool(cached["mpi"])
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    built = _ask_horovod()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"key": key, "mpi": built}))
        os.replace(partial, cache)
    except OSError:
        pass  # an unwritable cache costs the probe next time, nothing else
    return built


def _build_identity() -> list[list[object]] | None:
    """Path, size and modification time of Horovod's compiled extensions (found without
    importing Horovod); None when Horovod is not installed."""
    found = importlib.util.find_spec("horovod")
    if found is None or not found.submodule_search_locations:
        return None
    package = Path(next(iter(found.submodule_search_locations)))
    identity: list[list[object]] = []
    for library in sorted(package.glob("*/*.so")):
        stat = library.stat()
        identity.append([str(library), stat.st_size, stat.st_mtime_ns])
    return identity


def _ask_horovod() -> bool:
    try:
        done = subprocess.run(
            [sys.executable, "-c", MPI_BUILT_PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    lines = done.stdout.split()
    return done.returncode == 0 and bool(lines) and lines[-1] == "1"
