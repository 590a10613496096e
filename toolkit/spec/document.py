"""Spec and config text (YAML or JSON) -> plain data, safely, remembering what the user wrote.

PyYAML's `safe_load` is not safe enough for a file anyone may hand over: it expands aliases
without limit (a 470-byte "billion laughs" takes minutes and gigabytes), recurses once per
nesting level, keeps the last of two equal keys silently, and resolves scalars by YAML 1.1
(`yes` is true, `1:30:00` is 5400, `1e-3` is text). So YAML is read here from PyYAML's event
stream (the parser is iterative) into plain data by our own rules:

- YAML 1.2 core resolution: only true/false are booleans, only null/~ is null; integers are
  decimal, 0o or 0x; floats include 1e-3, .inf and .nan; everything else is text. Tags other
  than the standard str/int/float/bool/null/map/seq are refused.
- Limits: nesting depth, values in all (aliases counted at their full expanded size, before
  anything is expanded), and the length of a number's text.
- Duplicate keys are an error, at any depth.
- The source text of every unquoted scalar is kept by field path (`Document.written`), so
  errors show `yes`, `1:30:00` or `1e400` as written (a quoted one is shown quoted).

JSON is read by `json` with the same duplicate-key, depth and number-length rules.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from toolkit.spec.errors import IssueList, SpecError, SpecIssue, cut
from toolkit.spec.translate import join_path

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists (a spec nests 3 deep)."""
MAX_NODES = 200_000
"""Values in a document, aliases counted at their expanded size."""
MAX_NUMBER_CHARS = 100
"""Longest number text: beyond it no field's range is met, and conversion gets costly."""

_Y = "tag:yaml.org,2002:"
_NULL = re.compile(r"~|null|Null|NULL|")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT = re.compile(
    r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Document:
    """Parsed data, and the source text of its unquoted scalars (JSON: numbers) by field path."""

    data: Any
    written: dict[str, str] = field(default_factory=dict)


def parse_document(text: str, source: str, *, root: str = "") -> Document:
    """Plain data from YAML or JSON text (JSON when `source` ends in .json); SpecError naming
    `source` when it does not parse or breaks a limit. `root` prefixes the paths of problems
    ("deepspeed" for a DeepSpeed config; a spec's paths start at its sections)."""
    if source.endswith(".json"):
        return _parse_json(text, source, root)
    return _YamlBuilder(source, root).build(text)


def _refuse(source: str, problem: str, hint: str, root: str = "") -> SpecError:
    return SpecError.single(root or "spec", source, problem, hint=hint)


def _too_deep(path: str) -> SpecIssue:
    # "a[0][0][0]...[0]" 32 times says nothing more than "a[0][0][...]".
    shown = re.sub(r"((?:\[[0-9]+\]){2})(?:\[[0-9]+\]|\.[^.\[]*)+$", r"\1[...]", path)
    return SpecIssue(
        path=shown or "spec",
        value=None,
        written="...",
        allowed=f"nests deeper than {MAX_DEPTH} levels",
        hint="a spec is sections of keys and short lists",
    )


def _long_number(path: str, text: str) -> SpecIssue:
    return SpecIssue(
        path=path or "spec",
        value=None,
        written=text,
        allowed=f"a number of {len(text)} characters is out of range for every field",
        hint=f"write a number of at most {MAX_NUMBER_CHARS} characters",
    )


def _number(text: str) -> int | float:
    """The value of text that matched _INT or _FLOAT (at most MAX_NUMBER_CHARS long)."""
    if _INT.fullmatch(text):
        return int(text, 0) if text[:2] in ("0o", "0x") else int(text)
    lowered = text.lower()
    if lowered.endswith(".nan"):
        return math.nan
    if lowered.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    return float(text)


@dataclass
class _Open:
    """A mapping or list being built."""

    value: dict[Any, Any] | list[Any]
    path: str
    anchor: str | None
    size: int = 1
    key: Any = None
    has_key: bool = False
    key_is_bad: bool = False


class _YamlBuilder:
    def __init__(self, source: str, root: str) -> None:
        self.source = source
        self.root = root
        self.stack: list[_Open] = []
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.nodes = 0
        self.written: dict[str, str] = {}
        self.issues = IssueList()
        self.roots: list[Any] = []

    def build(self, text: str) -> Document:
        try:
            for event in yaml.parse(text, Loader=_LOADER):
                self._event(event)
        except (yaml.YAMLError, UnicodeError) as error:
            detail = " ".join(str(error).split())[:200]
            raise self._refusal(f"is not valid YAML: {detail}", "check the file's syntax") from None
        self.issues.raise_if_any()
        if len(self.roots) > 1:
            raise self._refusal(
                "holds several YAML documents",
                "keep one document (one '---') per file",
            )
        return Document(self.roots[0] if self.roots else None, self.written)

    def _refusal(self, problem: str, hint: str) -> SpecError:
        return _refuse(self.source, problem, hint, self.root)

    def _event(self, event: yaml.Event) -> None:
        if isinstance(event, yaml.ScalarEvent):
            value = self._scalar(event)
            self._add(value, 1, event.anchor)
        elif isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            self._open(event)
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            done = self.stack.pop()
            if done.has_key:  # a key without a value cannot happen in a well-formed stream
                raise self._refusal("has a key without a value", "check the file's syntax")
            self._add(done.value, done.size, done.anchor)
        elif isinstance(event, yaml.AliasEvent):
            self._alias(event)

    def _child_path(self) -> str:
        if not self.stack:
            return self.root
        top = self.stack[-1]
        if isinstance(top.value, list):
            return f"{top.path}[{len(top.value)}]"
        if not top.has_key:
            return join_path(top.path, "<key>")
        return join_path(top.path, cut(str(top.key), 60))

    def _count(self, size: int) -> None:
        self.nodes += size
        if self.nodes > MAX_NODES:
            raise self._refusal(
                f"holds more than {MAX_NODES} values (aliases counted expanded)",
                "write the spec out plainly; aliases must not multiply it",
            )

    def _open(self, event: yaml.CollectionStartEvent) -> None:
        tag = event.tag
        expected = _Y + ("map" if isinstance(event, yaml.MappingStartEvent) else "seq")
        if tag not in (None, "!", expected):
            self._bad_tag(tag)
        if len(self.stack) >= MAX_DEPTH:
            self.issues.add(_too_deep(self._child_path()))
            self.issues.raise_if_any()
        self._count(1)
        value: dict[Any, Any] | list[Any] = {} if isinstance(event, yaml.MappingStartEvent) else []
        self.stack.append(_Open(value=value, path=self._child_path(), anchor=event.anchor))

    def _alias(self, event: yaml.AliasEvent) -> None:
        anchor = str(event.anchor)
        if anchor not in self.anchors:
            raise self._refusal(
                f"uses alias *{cut(anchor, 40)} before (or inside) its anchor",
                "define &anchor on a complete value before using *anchor",
            )
        value, size = self.anchors[anchor]
        self._count(size)
        self._add(value, size, None)

    def _add(self, value: Any, size: int, anchor: str | None) -> None:
        if anchor is not None:
            self.anchors[anchor] = (value, size)
        if not self.stack:
            self.roots.append(value)
            return
        top = self.stack[-1]
        top.size += size
        if isinstance(top.value, list):
            top.value.append(value)
        elif not top.has_key:
            top.key, top.has_key = value, True
            top.key_is_bad = isinstance(value, dict | list)
            if top.key_is_bad:
                self.issues.add(
                    SpecIssue(
                        path=join_path(top.path, "<key>"),
                        value=value,
                        allowed="keys must be names, not mappings or lists",
                        hint="write the key as a plain name",
                    )
                )
        else:
            self._set(top, value)

    def _set(self, top: _Open, value: Any) -> None:
        key, top.has_key = top.key, False
        assert isinstance(top.value, dict)
        if top.key_is_bad:
            return
        if key in top.value:
            self.issues.add(
                SpecIssue(
                    path=join_path(top.path, cut(str(key), 60)),
                    value=key,
                    allowed="key given twice in one mapping",
                    hint="keep one of them (YAML would silently use the last)",
                )
            )
            return
        top.value[key] = value

    def _scalar(self, event: yaml.ScalarEvent) -> Any:
        text, tag = event.value, event.tag
        if tag is None and not event.style:  # plain (the C parser gives style "" for plain)
            kind = "resolve"
        elif tag is None or tag == "!":
            return text  # quoted, block, or the non-specific tag "!": text
        else:
            kind = tag.removeprefix(_Y) if tag.startswith(_Y) else tag
        path = self._child_path()
        if kind == "str":
            return text
        if kind not in ("resolve", "null", "bool", "int", "float"):
            self._bad_tag(str(tag))
        value = self._resolve(text, kind, path)
        if not self._at_key():
            self.written[path] = text
        return value

    def _at_key(self) -> bool:
        """True when the next value is a mapping's key."""
        return (
            bool(self.stack)
            and isinstance(self.stack[-1].value, dict)
            and not self.stack[-1].has_key
        )

    def _resolve(self, text: str, kind: str, path: str) -> Any:
        if kind in ("resolve", "null") and _NULL.fullmatch(text):
            return None
        if kind in ("resolve", "bool") and text in _BOOL:
            return _BOOL[text]
        numeric = _INT.fullmatch(text) or (kind != "int" and _FLOAT.fullmatch(text))
        if kind in ("resolve", "int", "float") and numeric:
            if len(text) > MAX_NUMBER_CHARS:
                self.issues.add(_long_number(path, text))
                return None
            value = _number(text)
            return float(value) if kind == "float" else value
        if kind == "resolve":
            return text
        self.issues.add(
            SpecIssue(
                path=path or "spec",
                value=text,
                allowed=f"is not a valid !!{kind}",
                hint="remove the tag or fix the value",
            )
        )
        return None

    def _bad_tag(self, tag: str) -> None:
        raise self._refusal(
            f"uses the YAML tag {cut(tag, 60)}",
            "a spec holds plain values: remove the tag",
        )


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


def _parse_json(text: str, source: str, root: str) -> Document:
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
        raise _refuse(source, too_deep, "check the file", root) from None
    except ValueError as error:
        detail = " ".join(str(error).split())[:200]
        invalid = f"is not valid JSON: {detail}"
        raise _refuse(source, invalid, "check the file's syntax", root) from None
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
                issues.add(_too_deep(path))
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
                issues.add(_long_number(path, value.text))
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
