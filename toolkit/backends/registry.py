"""Load the class that implements an engine, and refuse a launch environment it cannot run in.

The facts (which class, which launchers, which environments) live in `toolkit.engines`; this
module only turns them into the toolkit's errors and imports the chosen backend class.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from toolkit import engines
from toolkit.errors import ToolkitError

if TYPE_CHECKING:
    from toolkit.backends.base import Backend


def _engine(backend: str, framework: str) -> engines.Engine:
    try:
        return engines.engine(backend, framework)
    except engines.UnknownEngine as error:
        raise ToolkitError(
            f"unknown engine: {error}.", "change backend or framework in the spec"
        ) from None


def check_environment(backend: str, framework: str, environment: str) -> None:
    """Refuse, before the engine starts, a launch environment the engine cannot run under."""
    refusal = engines.environment_refusal(backend, framework, environment)
    if refusal is not None:
        launcher = _engine(backend, framework).implied_launcher
        raise ToolkitError(
            f"this process was started by {environment}: {refusal}.",
            f"start the script with one of those, e.g. `toolkit launch` with "
            f"launch.launcher: {launcher}",
        )


def check_launcher(backend: str, framework: str, launcher: str) -> None:
    """Refuse a launcher that cannot start the engine (the same words as `toolkit spec check`)."""
    refusal = engines.launcher_refusal(backend, framework, launcher)
    if refusal is not None:
        raise ToolkitError(
            f"launch.launcher={launcher!r}: {refusal}.",
            "remove launch.launcher to use the backend's usual one",
        )


def load_backend_class(
    backend: str, framework: str, *, parameter_server: bool = False
) -> type[Backend]:
    """The engine's backend class; with `parameter_server`, the one that runs parameter
    servers (`toolkit spec check` refuses the strategy on engines without one)."""
    entry = _engine(backend, framework)
    path = entry.parameter_server_class if parameter_server else entry.backend_class
    if path is None:
        raise ToolkitError(
            f"backend {backend} has no parameter servers", "remove tf.strategy from the spec"
        )
    module_name, _, class_name = path.partition(":")
    backend_class: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return backend_class
