"""`pip install .` into a fresh virtual environment gives a working CLI without any engine.

The core (spec, render, launch, doctor, cli) imports no engine, so a user can add the toolkit
to an environment of their own: this builds and installs the package as pip does for them
(a wheel, not editable) into a new venv with nothing else, then checks a spec and renders its
DeepSpeed config. It needs the package index for the core's dependencies (pydantic, numpy...).
"""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "hvd_examples" / "specs" / "zero2.yaml"

pytestmark = pytest.mark.install


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, **kwargs)  # type: ignore[call-overload]


def test_pip_install_into_a_fresh_venv_gives_spec_check_and_config(tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    installed = run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(ROOT)])
    assert installed.returncode == 0, installed.stderr[-3000:]
    engines = run([str(bin_dir / "python"), "-c", "import torch"])
    assert engines.returncode != 0, "the fresh venv should hold no engine"
    checked = run([str(bin_dir / "toolkit"), "spec", "check", str(SPEC)])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rendered = run([str(bin_dir / "toolkit"), "config", "deepspeed", "--spec", str(SPEC)])
    assert rendered.returncode == 0, rendered.stderr
    config = json.loads(rendered.stdout)
    assert config["zero_optimization"]["stage"] == 2
    marker = "import toolkit, pathlib; print(pathlib.Path(toolkit.__file__).with_name('py.typed'))"
    typed = run([str(bin_dir / "python"), "-c", marker])
    assert Path(typed.stdout.strip()).is_file(), typed.stderr
