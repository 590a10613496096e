"""Named DeepSpeed presets: spec files in ds_configs/specs/, rendered to ds_configs/<name>.json.

    python -m toolkit.render.presets ds_configs/            # regenerate
    python -m toolkit.render.presets --check ds_configs/    # exit 1 if any file is stale
    (same as `toolkit config presets --write ds_configs/` and `--check`)

Each preset is an ordinary spec (`ds_configs/specs/<name>.yaml`), rendered at its own
launch.np. The JSON files are generated: edit the specs, then regenerate; a test diffs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.render.deepspeed import deepspeed_config
from toolkit.spec import TrainSpec, load_spec

SPECS = "specs"
"""Subdirectory of the presets directory holding the preset specs."""


def preset_specs(directory: str | Path) -> dict[str, TrainSpec]:
    """Preset name -> spec, from <directory>/specs/*.yaml; ToolkitError when there are none
    (a wrong directory must not pass a check, nor write an empty one)."""
    paths = sorted(Path(directory, SPECS).glob("*.yaml"))
    if not paths:
        raise ToolkitError(
            f"{directory} is not a presets directory: it has no {SPECS}/*.yaml",
            hint="give the directory holding specs/, e.g. ds_configs/",
        )
    return {path.stem: load_spec(path) for path in paths}


def render_json(config: dict[str, object]) -> str:
    """The file text of one generated config."""
    return json.dumps(config, indent=2) + "\n"


def render_presets(directory: str | Path) -> dict[str, str]:
    """File name -> JSON text for every preset."""
    return {
        f"{name}.json": render_json(deepspeed_config(spec))
        for name, spec in preset_specs(directory).items()
    }


def write_presets(directory: str | Path) -> list[str]:
    """Regenerate every preset's JSON file; returns the names written."""
    rendered = render_presets(directory)
    for name, text in rendered.items():
        try:
            Path(directory, name).write_text(text, encoding="utf-8")
        except OSError as error:
            raise ToolkitError(
                f"cannot write {Path(directory, name)}: {error.strerror or error}",
                hint="check that the presets directory is writable",
            ) from None
    return sorted(rendered)


def stale_presets(directory: str | Path) -> list[str]:
    """JSON files that are missing, differ from what the specs render, or have no spec."""
    rendered = render_presets(directory)
    stale = [name for name, text in rendered.items() if _current(Path(directory, name)) != text]
    stale += [path.name for path in Path(directory).glob("*.json") if path.name not in rendered]
    return sorted(stale)


def _current(path: Path) -> str | None:
    """The text of a generated file, or None when it is missing or unreadable."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.render.presets", description=__doc__)
    parser.add_argument("directory", help="the presets directory, e.g. ds_configs/")
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    try:
        return check_or_write(args.directory, check=args.check)
    except ToolkitError as error:
        print(f"error: {error.one_line()}", file=sys.stderr)
        return 2


def check_or_write(directory: str, *, check: bool) -> int:
    """With `check`, name the stale files and return 1 if any; else write every preset."""
    if check:
        stale = stale_presets(directory)
        for name in stale:
            print(f"stale: {name} (regenerate: toolkit config presets --write {directory})")
        return 1 if stale else 0
    for name in write_presets(directory):
        print(f"wrote {Path(directory, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
