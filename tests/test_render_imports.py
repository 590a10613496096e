"""The spec and render layers never import an engine (DESIGN: only backends do)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("torch", "deepspeed", "horovod", "tensorflow", "keras", "mpi4py")


def test_spec_render_and_cli_commands_import_no_engine() -> None:
    modules = [
        "toolkit.spec",
        *(f"toolkit.render.{path.stem}" for path in sorted((ROOT / "toolkit/render").glob("*.py"))),
        "toolkit.commands.config",
        "toolkit.commands.spec",
        "toolkit.commands.launch",
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ENGINES!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
