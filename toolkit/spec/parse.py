"""Plain data (parsed YAML/JSON) <-> TrainSpec, collecting every issue into one SpecError.

Types are checked by `toolkit.spec.typecheck`. A field with the wrong type is reported and
replaced by its default so the rest of the spec is still checked; cross-field rules that read a
section holding such a field are skipped (see `toolkit.spec.validate`), so every issue reported
is a real one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from toolkit.spec.errors import SpecError, SpecIssue
from toolkit.spec.hosts import parse_hostfile
from toolkit.spec.model import TrainSpec
from toolkit.spec.typecheck import describe, file_key, parse_fields
from toolkit.spec.validate import collect_issues


def _unvalidated(values: dict[str, Any]) -> TrainSpec:
    """A TrainSpec without running its validation: lets a broken spec report every issue."""
    spec = object.__new__(TrainSpec)
    for spec_field in dataclasses.fields(TrainSpec):
        if spec_field.name in values:
            value = values[spec_field.name]
        elif spec_field.default_factory is not dataclasses.MISSING:
            value = spec_field.default_factory()
        else:
            value = spec_field.default
        object.__setattr__(spec, spec_field.name, value)
    return spec


def _read_hostfile(
    values: dict[str, Any], data: Mapping[Any, Any], base_dir: str | None, issues: list[SpecIssue]
) -> None:
    """Fill launch.hosts from launch.hostfile (a file read at load time, relative to base_dir)."""
    launch = values.get("launch")
    raw_launch = data.get("launch")
    if launch is None or launch.hostfile is None:
        return
    if isinstance(raw_launch, Mapping) and "hosts" in raw_launch:
        issues.append(
            SpecIssue(
                path="launch.hostfile",
                value=launch.hostfile,
                allowed="give launch.hosts or launch.hostfile, not both",
                hint="remove one of them",
            )
        )
        return
    path = os.path.join(base_dir or os.getcwd(), os.path.expanduser(launch.hostfile))
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    except (OSError, UnicodeDecodeError) as error:
        issues.append(
            SpecIssue(
                path="launch.hostfile",
                value=launch.hostfile,
                allowed=f"must be a readable text file ({error.__class__.__name__})",
                hint="relative paths are resolved from the spec file's directory",
            )
        )
        return
    entries, hostfile_issues = parse_hostfile(text, "launch.hostfile")
    issues.extend(hostfile_issues)
    values["launch"] = dataclasses.replace(launch, hosts=tuple(entries))


def spec_from_dict(data: Any, *, base_dir: str | None = None) -> TrainSpec:
    """Parse and validate; every issue comes back together in one SpecError."""
    if not isinstance(data, Mapping):
        raise SpecError.single(
            "spec", data, f"must be {describe(TrainSpec)}", hint="a spec is a YAML/JSON mapping"
        )
    issues: list[SpecIssue] = []
    values = parse_fields(data, TrainSpec, "", issues)
    _read_hostfile(values, data, base_dir, issues)
    if not issues:
        return TrainSpec(**values)
    bad_sections = {issue.path.split(".")[0].split("[")[0].split(":")[0] for issue in issues}
    issues.extend(collect_issues(_unvalidated(values), skip_sections=bad_sections))
    raise SpecError(issues)


def spec_to_dict(spec: Any) -> Any:
    """Plain data with file keys; tuples become lists so YAML/JSON dumpers take it."""
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        return {file_key(f): spec_to_dict(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
    if isinstance(spec, tuple | list):
        return [spec_to_dict(item) for item in spec]
    if isinstance(spec, dict):
        return {name: spec_to_dict(item) for name, item in spec.items()}
    return spec
