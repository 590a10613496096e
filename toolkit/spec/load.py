"""Reading and writing spec files (YAML or JSON), and any YAML/JSON file a user hands over."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from toolkit.rank_variables import TOOLKIT_SPEC
from toolkit.spec.document import Document
from toolkit.spec.errors import SpecError
from toolkit.spec.json_reader import read_json
from toolkit.spec.model import TrainSpec, build_spec
from toolkit.spec.yaml_reader import read_yaml
from toolkit.userfiles import MIB, UserFileError, read_text

SPEC_LIMIT = 1 * MIB
"""Largest spec file read (a spec is a few hundred bytes; a long host list a few hundred KiB)."""


def parse_document(text: str, source: str, *, root: str = "") -> Document:
    """Plain data from YAML or JSON text (JSON when `source` ends in .json: YAML reads JSON
    too, but JSON's own errors read better); SpecError naming `source` when it does not parse
    or breaks a limit. `root` prefixes the paths of problems ("deepspeed" for a DeepSpeed
    config; a spec's paths start at its sections)."""
    if source.endswith(".json"):
        return read_json(text, source, root)
    return read_yaml(text, source, root)


def read_document(
    path: str | os.PathLike[str], *, what: str, field: str = "spec", limit: int = SPEC_LIMIT
) -> Document:
    """A YAML/JSON file read within `limit` bytes and parsed; SpecError at `field` when it
    cannot be read or parsed (`what` names the file in the message)."""
    try:
        text = read_text(path, limit=limit, what=what, hint=f"check the {what}'s path")
    except UserFileError as error:
        raise SpecError.single(field, str(path), error.reason, hint=error.hint) from None
    return parse_document(text, str(path), root="" if field == "spec" else field)


def launched_spec_path(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The spec a script was started with: `--spec FILE` among its arguments, else the one
    `toolkit launch` names in TOOLKIT_SPEC; SpecError when there is neither."""
    args = list(sys.argv[1:] if argv is None else argv)
    for position, arg in enumerate(args):
        if arg == "--spec" and position + 1 < len(args):
            return args[position + 1]
        if arg.startswith("--spec="):
            return arg.removeprefix("--spec=")
    path = (os.environ if env is None else env).get(TOOLKIT_SPEC)
    if path:
        return path
    raise SpecError.single(
        "spec",
        None,
        "no spec given: the script has no --spec argument and was not started by toolkit launch",
        hint="start it with `toolkit launch --spec FILE -- SCRIPT`, pass --spec FILE, or call "
        "load_spec(FILE)",
    )


def load_spec(source: str | os.PathLike[str] | dict[str, Any] | None = None) -> TrainSpec:
    """A validated TrainSpec from a YAML/JSON file path or already-parsed data; with no
    argument, the spec the script was started with (`launched_spec_path`).

    A relative launch.hostfile is read from the spec file's directory. Values in errors are
    shown as the file wrote them.
    """
    if source is None:
        source = launched_spec_path()
    if isinstance(source, dict):
        return TrainSpec.from_dict(source)
    path = Path(source)
    document = read_document(path, what="spec")
    if document.data is None:
        raise SpecError.single(
            "spec",
            str(path),
            "is empty",
            hint="a spec holds at least its backend, e.g. backend: ddp",
        )
    return build_spec(document.data, base_dir=str(path.parent), written=document.written)


def dump_spec(spec: TrainSpec | dict[str, Any]) -> str:
    """YAML text for a spec (or spec data), in field order, that load_spec reads back."""
    data = spec.to_dict() if isinstance(spec, TrainSpec) else spec
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
