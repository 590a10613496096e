"""Pydantic's validation errors -> SpecIssues in the spec's own words, each with a hint.

Pydantic reports where (`loc`), what (`type`) and the input; this module turns that into what a
spec user reads: the dotted path with file keys (`batch.global`), the value as written, what is
allowed (the choices of a Literal, the keys of a section, the bound broken) and what to change.

The spec's own validators raise two custom error types (see `toolkit.spec.fields`):
`spec_field` (one issue at the error's location, its text in the context) and `spec_rule`
(several issues, their paths relative to the model that owns the validated field).
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from toolkit.spec.errors import SpecIssue

_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}
_NUMBER_TYPES = {"int_type", "int_parsing", "int_from_float", "float_type", "float_parsing"}
_GENERIC_HINT = "`toolkit spec schema` lists every field and what it takes"
_NUMERIC = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def join_path(base: str, part: str) -> str:
    """`base` + `part`, where `part` starts with a key ("lr"), an index ("[0]") or ":N"."""
    if not base:
        return part
    return base + part if part[:1] in ("[", ":") else f"{base}.{part}"


def loc_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as a dotted spec path; `[key]` marks a dict key itself."""
    path = ""
    for index, part in enumerate(loc):
        if part == "[key]":
            continue
        is_key = index + 1 < len(loc) and loc[index + 1] == "[key]"
        if isinstance(part, int) and not is_key:
            path += f"[{part}]"
        else:
            path = join_path(path, str(part))
    return path


def issues_from(
    error: ValidationError, root: type[BaseModel], written: Mapping[str, str] | None = None
) -> tuple[list[SpecIssue], int]:
    """Every problem in `error` (raised validating `root`), values shown as `written`; and how
    many more were found than kept (a rule over a long list keeps only the first ones)."""
    issues = list(_issues(error, root, written or {}))
    more = sum(
        detail["ctx"]["count"] - len(detail["ctx"]["issues"])
        for detail in error.errors(include_url=False, include_input=False)
        if detail["type"] == "spec_rule"
    )
    return issues, more


def _issues(
    error: ValidationError, root: type[BaseModel], texts: Mapping[str, str]
) -> Iterator[SpecIssue]:
    for detail in error.errors(include_url=False):
        loc = tuple(detail["loc"])
        ctx = detail.get("ctx") or {}
        if detail["type"] == "spec_rule":
            base = loc_path(loc[:-1])
            for issue in ctx["issues"]:
                path = join_path(base, issue.path)
                yield replace(issue, path=path, written=texts.get(path, issue.written))
            continue
        path = loc_path(loc) or "spec"
        # An unknown key ends the location as written, even one the user spelt "[key]", which
        # elsewhere is pydantic's marker for a mapping's key.
        unknown_key = detail["type"] == "extra_forbidden"
        if unknown_key or (detail["type"] == "invalid_key" and loc[-1:] != ("[key]",)):
            path = join_path(loc_path(loc[:-1]), str(loc[-1]))  # a key of the model itself
        elif loc[-1:] == ("[key]",):  # a mapping's key, not its value, is wrong
            yield SpecIssue(
                path=path,
                value=detail.get("input"),
                allowed="names must be text",
                hint="write the name as text starting with a letter, e.g. MY_VARIABLE",
            )
            continue
        value, written = detail.get("input"), texts.get(path)
        allowed, hint = describe(
            detail["type"], value, ctx, root, loc, unquoted=written is not None
        )
        yield SpecIssue(path=path, value=value, allowed=allowed, hint=hint, written=written)


def describe(
    kind: str,
    value: Any,
    ctx: Mapping[str, Any],
    root: type[BaseModel],
    loc: tuple[Any, ...],
    *,
    unquoted: bool = False,
) -> tuple[str, str]:
    """(allowed, hint) for one pydantic error; `unquoted` when a text value was written
    without quotes in a YAML file (so "remove the quotes" would be wrong)."""
    if kind == "spec_field":
        return str(ctx["allowed"]), str(ctx["hint"])
    if kind == "extra_forbidden":
        return _unknown_key(loc, root)
    if kind == "invalid_key":
        return "keys must be names (text)", "write the key as a name, e.g. MY_VARIABLE"
    if kind in _NUMBER_TYPES:
        whole = kind.startswith("int")
        allowed = "must be an integer" if whole else "must be a number"
        return allowed, _number_hint(value, whole, unquoted)
    if kind == "finite_number":
        return "must be a finite number", "write an ordinary number, not .inf, .nan or 1e400"
    if kind in ("bool_type", "bool_parsing"):
        return "must be true or false", _bool_hint(value, unquoted)
    if kind == "string_type":
        return "must be a string", _string_hint(value)
    if kind == "literal_error":
        return _choice(value, _literal_choices(_annotation_at(root, loc)), unquoted)
    if kind in _BOUNDS:
        name, sign = _BOUNDS[kind]
        bound = ctx.get(name)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"must be {sign} {bound}", f"use a value {sign} {bound}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        model = _model_at(root, loc)
        keys = f" with keys {', '.join(keys_of(model))}" if model is not None else ""
        return f"must be a mapping{keys}", "write it as key: value pairs"
    message = " ".join(str(value) for value in ctx.values()) if ctx else kind.replace("_", " ")
    return f"is not valid ({message[:100]})", _GENERIC_HINT


def keys_of(model: type[BaseModel]) -> list[str]:
    """The spec-file keys of a section, in order."""
    return [info.alias or name for name, info in model.model_fields.items()]


REMOVED_KEYS = {
    ("ddp", "allreduce"): "DDP sums its buckets through its own process group (Gloo on CPU)",
    ("deepspeed", "allreduce"): "DeepSpeed reduces through its own communication backend",
    ("deepspeed", "send_recv"): "the pipeline engine sends through its own schedule",
    ("launch", "malloc"): "ranks keep the allocator settings of their environment",
}
"""Keys earlier releases had, which chose the toolkit's own transports or allocator settings over
an engine's; each engine now uses its own (CHANGELOG.md). A spec that still has one is told so."""

MOVED_KEYS = {("fsdp", "replicate"): "parallel.replicate"}
"""Keys that moved into the one parallel layout (`parallel:`); a spec that still has one is told
where it lives now."""


def _unknown_key(loc: tuple[Any, ...], root: type[BaseModel]) -> tuple[str, str]:
    model = _model_at(root, loc[:-1])
    keys = keys_of(model) if model is not None else []
    key = str(loc[-1])[:100]
    removed = REMOVED_KEYS.get((str(loc[-2]), key)) if len(loc) >= 2 else None
    if removed:
        return "a key this release no longer has", f"remove it: {removed}"
    moved = MOVED_KEYS.get((str(loc[-2]), key)) if len(loc) >= 2 else None
    if moved:
        return f"moved to {moved}: the layout of the ranks lives in parallel", f"write {moved}"
    close = [name for name in keys if name.lower() == key.lower()]
    close = close or difflib.get_close_matches(key, keys, n=1)
    if close:
        hint = f"did you mean {close[0]!r}?"
    elif key == "<<":
        hint = "YAML merge keys are not supported in a spec: write the keys out"
    else:
        hint = "remove it"
    return "unknown key; allowed keys: " + ", ".join(keys), hint


def _number_hint(value: Any, whole: bool, unquoted: bool) -> str:
    example = "a whole number, e.g. 4" if whole else "a number, e.g. 0.001 or 1e-3"
    if isinstance(value, bool):
        return f"write {example}, not true/false"
    if isinstance(value, str):
        if not unquoted and _NUMERIC.fullmatch(value.strip()[:100]):
            return "remove the quotes"
        return f"write {example}, without units, underscores or quotes"
    if isinstance(value, float) and whole:
        return "write a whole number, without a decimal point or exponent"
    if value is None:
        return f"write {example}, or remove the key to use the default"
    if isinstance(value, dict | list | tuple):
        return f"write one value: {example}"
    return f"write {example}"


def _bool_hint(value: Any, unquoted: bool) -> str:
    if isinstance(value, str):
        if not unquoted and value.strip().lower() in ("true", "false"):
            return "remove the quotes"
        return "write true or false (yes, no, on and off are text in a spec)"
    if value is None:
        return "write true or false, or remove the key to use the default"
    return "write true or false"


def _string_hint(value: Any) -> str:
    if isinstance(value, bool | int | float):
        return "quote it to make it text"
    if value is None:
        return "write a value, or remove the key to use the default"
    return "write one text value"


def _choice(value: Any, choices: list[Any], unquoted: bool) -> tuple[str, str]:
    allowed = "allowed " + ", ".join(str(choice) for choice in choices)
    names = [str(choice) for choice in choices]
    hint = "use one of the allowed values"
    if isinstance(value, str):
        text = value.strip()[:100]
        close = [name for name in names if name.lower() == text.lower()]
        close = close or difflib.get_close_matches(text, names, n=1)
        if text in names and not unquoted:
            hint = "remove the quotes"
        elif close:
            hint = f"did you mean {close[0]!r}?"
    elif isinstance(value, bool | float) and any(isinstance(c, int) for c in choices):
        hint = "write one of the allowed whole numbers"
    elif not isinstance(value, str | int) and any(isinstance(c, str) for c in choices):
        hint = "write one of the allowed names"
    return allowed, hint


def _literal_choices(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    for arg in typing.get_args(annotation):
        choices = _literal_choices(arg)
        if choices:
            return choices
    return []


def _annotation_at(root: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The type annotation of the field at `loc` (None when `loc` is not a field)."""
    model: type[BaseModel] | None = root
    annotation: Any = None
    for part in loc:
        if model is None:
            return annotation
        annotation = _field_annotation(model, part)
        model = _as_model(annotation)
    return annotation


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section model at `loc` (the root for an empty `loc`)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None:
            return None
        model = _as_model(_field_annotation(model, part))
    return model


def _field_annotation(model: type[BaseModel], key: Any) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info.annotation
    return None


def _as_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
