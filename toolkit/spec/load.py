"""Reading and writing spec files (YAML or JSON; JSON is YAML, but its errors read better)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from toolkit.spec.errors import SpecError
from toolkit.spec.model import TrainSpec


def parse_text(text: str, source: str) -> Any:
    """Plain data from YAML or JSON text; SpecError naming `source` when it does not parse."""
    try:
        if source.endswith(".json"):
            return json.loads(text)
        return yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        detail = " ".join(str(error).split())[:200]
        raise SpecError.single(
            "spec",
            source,
            f"is not valid {'JSON' if source.endswith('.json') else 'YAML'}: {detail}",
            hint="check the file's syntax",
        ) from None


def load_spec(source: str | os.PathLike[str] | dict[str, Any]) -> TrainSpec:
    """A validated TrainSpec from a YAML/JSON file path or already-parsed data.

    A relative launch.hostfile is read from the spec file's directory.
    """
    if isinstance(source, dict):
        return TrainSpec.from_dict(source)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError.single(
            "spec",
            str(path),
            f"must be a readable YAML or JSON file ({error.__class__.__name__})",
            hint="check the path given to --spec",
        ) from None
    return TrainSpec.from_dict(parse_text(text, str(path)), base_dir=str(path.parent))


def dump_spec(spec: TrainSpec | dict[str, Any]) -> str:
    """YAML text for a spec (or spec data), in field order, that load_spec reads back."""
    data = spec.to_dict() if isinstance(spec, TrainSpec) else spec
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
