"""Where the toolkit keeps what it writes for itself: ~/.cache/toolkit (XDG_CACHE_HOME honoured).

A neutral module: the command line's crash reports and the launch layer's cached machine facts
both live there.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "toolkit")
