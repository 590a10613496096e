"""JSON text -> plain data, by `json` with the limits and rules of `toolkit.spec.document`:
duplicate keys refused at any depth, nesting and number length bounded, and the text of every
number kept by field path (paired with the numbers in document order)."""

from __future__ import annotations

import json
from typing import Any

from toolkit.spec.document import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_NUMBER_CHARS,
    Document,
    long_number,
    refuse,
    too_deep,
)
from toolkit.spec.errors import IssueList, SpecIssue, cut
from toolkit.spec.translate import join_path


class _TooLong:
    """A JSON number whose text is too long; reported with its path after parsing."""

    def __init__(self, text: str) -> None:
        self.text = text


class _Duplicates(dict[str, Any]):
    """A JSON object that named some keys twice."""

    duplicates: list[str]


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    duplicates = []
    for key, value in pairs:
        if key in result:
            duplicates.append(key)
        result[key] = value
    if not duplicates:
        return result
    marked = _Duplicates(result)
    marked.duplicates = duplicates
    return marked


def read_json(text: str, source: str, root: str = "") -> Document:
    """Plain data from JSON text; SpecError naming `source` when it does not parse or breaks a
    limit (`root` prefixes the paths of problems)."""
    numbers: list[str] = []

    def number(kind: type[int] | type[float]) -> Any:
        def convert(literal: str) -> Any:
            numbers.append(literal)
            return _TooLong(literal) if len(literal) > MAX_NUMBER_CHARS else kind(literal)

        return convert

    def constant(literal: str) -> float:
        numbers.append(literal)
        return float(literal)

    try:
        data = json.loads(
            text,
            object_pairs_hook=_json_pairs,
            parse_int=number(int),
            parse_float=number(float),
            parse_constant=constant,
        )
    except RecursionError:
        too_deep = f"nests deeper than {MAX_DEPTH} levels"
        raise refuse(source, too_deep, "check the file", root) from None
    except ValueError as error:
        detail = " ".join(str(error).split())[:200]
        invalid = f"is not valid JSON: {detail}"
        raise refuse(source, invalid, "check the file's syntax", root) from None
    return _walk_json(data, numbers, root)


def _walk_json(data: Any, numbers: list[str], root: str) -> Document:
    """Check limits and duplicates, and pair each number with its text, in document order."""
    issues = IssueList()
    written: dict[str, str] = {}
    texts = iter(numbers)
    stack: list[tuple[str, Any, int]] = [(root, data, 0)]
    nodes = 0
    while stack:
        path, value, depth = stack.pop()
        nodes += 1
        if isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                issues.add(too_deep(path))
                continue
            if isinstance(value, _Duplicates):
                for key in value.duplicates:
                    issues.add(
                        SpecIssue(
                            path=join_path(path, cut(key, 60)),
                            value=key,
                            allowed="key given twice in one object",
                            hint="keep one of them (JSON readers would silently use the last)",
                        )
                    )
            items = value.items() if isinstance(value, dict) else enumerate(value)
            children = [
                (
                    join_path(path, f"[{key}]" if isinstance(value, list) else cut(str(key), 60)),
                    item,
                )
                for key, item in items
            ]
            stack.extend((child, item, depth + 1) for child, item in reversed(children))
        elif isinstance(value, int | float | _TooLong) and not isinstance(value, bool):
            written[path] = next(texts, "")
            if isinstance(value, _TooLong):
                issues.add(long_number(path, value.text))
    if nodes > MAX_NODES:
        issues.add(
            SpecIssue(
                path=root or "spec",
                value=None,
                written="...",
                allowed=f"holds more than {MAX_NODES} values",
                hint="a spec is sections of keys and short lists",
            )
        )
    issues.raise_if_any()
    return Document(data, written)
