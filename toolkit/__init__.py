"""toolkit: one training script and one spec file on every established distributed engine.

    import toolkit
    spec = toolkit.load_spec()        # the spec the job was launched with (or a path)
    run = toolkit.init(spec)

Attributes are imported on first use, so `import toolkit` (and the CLI, and `toolkit doctor`)
stays cheap and never imports an engine.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "init": "toolkit.runtime",
    "Run": "toolkit.runtime",
    "load_spec": "toolkit.spec",
    "script_args": "toolkit.launch",
    "TrainSpec": "toolkit.spec",
    "SpecError": "toolkit.spec",
    "ToolkitError": "toolkit.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
