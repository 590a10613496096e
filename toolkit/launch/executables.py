"""Where a launcher executable is: the one beside this interpreter (the venv's) wins over PATH.

`horovodrun`, `deepspeed` and `torchrun` are installed into the virtual environment with their
engines; finding them beside `sys.executable` means an un-activated venv still launches the
engines it holds instead of some other installation's.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def find_launcher(name: str) -> str | None:
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    return shutil.which(name)
