"""The launch layer: which launcher started this process, and starting and supervising jobs.

Imports no engine. `detect_environment` and `join_supervisor` run inside each rank;
`run_launcher` and `run_local` run on the machine that starts the job. Names are imported on
first use, so that importing one module of this package (`toolkit doctor` uses `executables`)
does not need psutil.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LaunchEnvironment": "toolkit.launch.environment",
    "detect_environment": "toolkit.launch.environment",
    "script_args": "toolkit.launch.environment",
    "split_local_rank_arg": "toolkit.launch.environment",
    "LaunchResult": "toolkit.launch.outcome",
    "join_supervisor": "toolkit.launch.rank_side",
    "run_launcher": "toolkit.launch.supervisor",
    "run_local": "toolkit.launch.supervisor",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'toolkit.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
