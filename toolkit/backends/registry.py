"""Which class implements each (backend, framework), and under which launchers it runs.

Adding an engine is one backend module and one entry here; nothing else branches on the
engine's name. Targets are "module:Class" strings so that looking an engine up never imports it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkit.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.backends.base import Backend

# Detected launcher names (toolkit.launch.environment) grouped as users name launchers.
MPI_ENVIRONMENTS = frozenset({"openmpi", "mpich"})
SINGLE = frozenset({"single"})


@dataclass(frozen=True, kw_only=True)
class BackendEntry:
    target: str
    """"module:Class" of the Backend implementation."""
    environments: frozenset[str]
    """Detected launch environments (LaunchEnvironment.launcher) the backend can start in."""
    launchers: tuple[str, ...]
    """Values of the spec's launch.launcher that `toolkit launch` may use for it."""


REGISTRY: dict[tuple[str, str], BackendEntry] = {
    ("ddp", "torch"): BackendEntry(
        target="toolkit.backends.ddp.backend:DDPBackend",
        environments=frozenset({"torchrun", "deepspeed", "toolkit", "srun", "torch_env"})
        | MPI_ENVIRONMENTS
        | SINGLE,
        launchers=("torchrun", "mpirun", "deepspeed", "srun", "local"),
    ),
    ("deepspeed", "torch"): BackendEntry(
        target="toolkit.backends.deepspeed.backend:DeepSpeedBackend",
        environments=frozenset({"deepspeed", "torchrun", "toolkit", "srun", "torch_env"})
        | MPI_ENVIRONMENTS
        | SINGLE,
        launchers=("deepspeed", "torchrun", "mpirun", "srun", "local"),
    ),
    ("horovod", "torch"): BackendEntry(
        target="toolkit.backends.horovod.torch_backend:HorovodTorchBackend",
        environments=frozenset({"horovodrun"}) | MPI_ENVIRONMENTS | SINGLE,
        launchers=("horovodrun", "mpirun"),
    ),
    ("horovod", "tensorflow"): BackendEntry(
        target="toolkit.backends.horovod.tf_backend:HorovodTFBackend",
        environments=frozenset({"horovodrun"}) | MPI_ENVIRONMENTS | SINGLE,
        launchers=("horovodrun", "mpirun"),
    ),
    ("tf", "tensorflow"): BackendEntry(
        target="toolkit.backends.tf.backend:TFBackend",
        environments=frozenset({"toolkit", "tf_config", "srun"}) | MPI_ENVIRONMENTS | SINGLE,
        launchers=("local", "mpirun", "srun"),
    ),
}


def entry_for(backend: str, framework: str) -> BackendEntry:
    try:
        return REGISTRY[(backend, framework)]
    except KeyError:
        pairs = ", ".join(f"{b}+{f}" for b, f in REGISTRY)
        raise ToolkitError(
            f"backend {backend!r} does not run framework {framework!r}; supported: {pairs}.",
            "change backend or framework in the spec",
        ) from None


def check_environment(backend: str, framework: str, environment: str) -> None:
    """Refuse, before the engine starts, a launcher the backend cannot run under."""
    entry = entry_for(backend, framework)
    if environment not in entry.environments:
        raise ToolkitError(
            f"backend {backend!r} ({framework}) cannot run under the {environment!r} launcher; "
            f"it runs under: {', '.join(entry.launchers)}.",
            f"start the script with one of those, e.g. `toolkit launch` with "
            f"launch.launcher: {entry.launchers[0]}",
        )


def check_launcher(backend: str, framework: str, launcher: str) -> None:
    """Refuse a spec whose launch.launcher cannot start its backend."""
    entry = entry_for(backend, framework)
    if launcher not in entry.launchers:
        raise ToolkitError(
            f"launch.launcher={launcher!r} cannot start backend {backend!r} ({framework}); "
            f"allowed: {', '.join(entry.launchers)}.",
            f"set launch.launcher to {entry.launchers[0]}",
        )


def load_backend_class(backend: str, framework: str) -> type[Backend]:
    module_name, _, class_name = entry_for(backend, framework).target.partition(":")
    backend_class: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return backend_class
