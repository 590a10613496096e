"""Type checking of spec data against the spec dataclasses' own type hints.

Driven by the type hints, so a new field needs no parser code: bool, int, float, str,
Literal[...], X | None, tuple[X, ...], tuple[X, Y], dict[str, str] and nested spec dataclasses.
Nothing is coerced except what YAML/JSON cannot say precisely: a list becomes a tuple, an int is
accepted as a float, and an integral float (JSON's 5e8) as an int. Unknown keys are errors with
a did-you-mean hint.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal

from toolkit.spec.errors import SpecIssue

_ENV_VALUE_TYPES = (str, int, float)


class _Invalid:
    """Marks a value that failed to parse (its issue is already recorded)."""


INVALID = _Invalid()


def file_key(spec_field: dataclasses.Field[Any]) -> str:
    """The spec-file key of a dataclass field (`global` for `global_`)."""
    return str(spec_field.metadata.get("key", spec_field.name))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def describe(tp: Any) -> str:
    """What a type accepts, in words for error messages."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "allowed " + ", ".join(str(arg) for arg in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join("null" if arg is type(None) else describe(arg) for arg in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of ({describe(args[0])})"
        return f"a list of {len(args)} items ({', '.join(describe(arg) for arg in args)})"
    if origin is dict:
        return "a mapping of names to strings"
    if dataclasses.is_dataclass(tp):
        keys = ", ".join(file_key(f) for f in dataclasses.fields(tp))
        return f"a mapping with keys {keys}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp)
    )


def _issue(
    issues: list[SpecIssue], path: str, value: Any, tp: Any, hint: str | None = None
) -> _Invalid:
    issues.append(SpecIssue(path=path, value=value, allowed=f"must be {describe(tp)}", hint=hint))
    return INVALID


def _parse_literal(value: Any, tp: Any, path: str, issues: list[SpecIssue]) -> Any:
    for arg in typing.get_args(tp):
        # type() equality: True must not pass for the zero stage 1, nor 1 for "1".
        if type(value) is type(arg) and value == arg:
            return value
    hint = None
    if isinstance(value, str):
        names = [str(arg) for arg in typing.get_args(tp)]
        close = [name for name in names if name.lower() == value.lower()]
        close = close or difflib.get_close_matches(value, names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else None
    issues.append(SpecIssue(path=path, value=value, allowed=describe(tp), hint=hint))
    return INVALID


def parse_value(value: Any, tp: Any, path: str, issues: list[SpecIssue]) -> Any:
    """`value` checked (and list→tuple converted) against `tp`, or INVALID with an issue."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return _parse_literal(value, tp, path, issues)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = [arg for arg in args if arg is not type(None)]
        if value is None:
            return _issue(issues, path, value, tp)
        return parse_value(value, inner, path, issues)
    if origin is tuple:
        return _parse_tuple(value, tp, path, issues)
    if origin is dict:
        return _parse_env(value, tp, path, issues)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            return _issue(issues, path, value, tp)
        cls = typing.cast(type, tp)
        return cls(**parse_fields(value, cls, path + ".", issues))
    if tp is bool:
        return value if isinstance(value, bool) else _issue(issues, path, value, tp)
    if tp is int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return _issue(issues, path, value, tp)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
            return _issue(issues, path, value, tp, hint="use a finite number")
        return _issue(issues, path, value, tp)
    if tp is str:
        if isinstance(value, str):
            return value
        quote = "quote it" if isinstance(value, int | float) else None
        return _issue(issues, path, value, tp, hint=quote)
    raise TypeError(f"spec field {path} has an unsupported type {tp!r}")  # a toolkit bug


def _parse_tuple(value: Any, tp: Any, path: str, issues: list[SpecIssue]) -> Any:
    args = typing.get_args(tp)
    if not isinstance(value, list | tuple):
        return _issue(issues, path, value, tp)
    if len(args) == 2 and args[1] is Ellipsis:
        item_types = [args[0]] * len(value)
    elif len(value) != len(args):
        return _issue(issues, path, value, tp)
    else:
        item_types = list(args)
    items = [
        parse_value(item, item_tp, f"{path}[{index}]", issues)
        for index, (item, item_tp) in enumerate(zip(value, item_types, strict=True))
    ]
    return INVALID if any(item is INVALID for item in items) else tuple(items)


def _parse_env(value: Any, tp: Any, path: str, issues: list[SpecIssue]) -> Any:
    if not isinstance(value, Mapping):
        return _issue(issues, path, value, tp)
    result: dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str):
            _issue(issues, f"{path}.{name!r}", name, str, hint="variable names are strings")
        elif isinstance(item, bool) or not isinstance(item, _ENV_VALUE_TYPES):
            _issue(issues, f"{path}.{name}", item, str, hint="quote the value in YAML")
        else:
            result[name] = str(item)
    return result if len(result) == len(value) else INVALID


def parse_fields(
    data: Mapping[Any, Any], cls: type, prefix: str, issues: list[SpecIssue]
) -> dict[str, Any]:
    """Field name -> parsed value for the keys of `data` that are valid fields of `cls`."""
    fields = {file_key(f): f for f in dataclasses.fields(cls)}
    for name, value in data.items():
        if name not in fields:
            close = difflib.get_close_matches(str(name), list(fields), n=1)
            issues.append(
                SpecIssue(
                    path=f"{prefix}{name}",
                    value=value,
                    allowed="unknown key; allowed keys: " + ", ".join(fields),
                    hint=f"did you mean {close[0]!r}?" if close else "remove it",
                )
            )
    values: dict[str, Any] = {}
    for name, spec_field in fields.items():
        if name not in data:
            continue
        parsed = parse_value(data[name], _hints(cls)[spec_field.name], prefix + name, issues)
        if parsed is INVALID or _constraint_issues(spec_field, parsed, prefix + name, issues):
            continue
        values[spec_field.name] = parsed
    return values


def _constraint_issues(
    spec_field: dataclasses.Field[Any], value: Any, path: str, issues: list[SpecIssue]
) -> bool:
    """Record the field's constraint issues for `value`; True when there were any."""
    check = spec_field.metadata.get("check")
    found = check(value, path) if check is not None else []
    issues.extend(found)
    return bool(found)


def check_instance(obj: Any, prefix: str, issues: list[SpecIssue]) -> None:
    """Record issues for fields of dataclass `obj` that break their types or constraints.

    For specs built in Python, where the parser never ran.
    """
    for spec_field in dataclasses.fields(obj):
        value = getattr(obj, spec_field.name)
        tp = _hints(typing.cast(type, type(obj)))[spec_field.name]
        path = prefix + file_key(spec_field)
        if dataclasses.is_dataclass(tp):
            if isinstance(value, typing.cast(type, tp)):
                check_instance(value, path + ".", issues)
            else:
                _issue(issues, path, value, tp)
        elif parse_value(value, tp, path, issues) is not INVALID:
            _constraint_issues(spec_field, value, path, issues)
