"""YAML text -> plain data, read from PyYAML's event stream (its parser is iterative) by our
own rules (see `toolkit.spec.document` for why):

- YAML 1.2 core resolution: only true/false are booleans, only null/~ is null; integers are
  decimal, 0o or 0x; floats include 1e-3, .inf and .nan; everything else is text. Tags other
  than the standard str/int/float/bool/null/map/seq are refused.
- Limits: nesting depth, values in all (aliases counted at their full expanded size, before
  anything is expanded: an alias adds its anchor's size, it is not copied), and the length of
  a number's text.
- Duplicate keys are an error, at any depth; keys must be scalars.
- The source text of every unquoted scalar is kept by field path (a quoted one is shown
  quoted).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from toolkit.spec.document import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_NUMBER_CHARS,
    Document,
    long_number,
    refuse,
    too_deep,
)
from toolkit.spec.errors import IssueList, SpecError, SpecIssue, cut
from toolkit.spec.translate import join_path

_Y = "tag:yaml.org,2002:"
_NULL = re.compile(r"~|null|Null|NULL|")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT = re.compile(
    r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(text: str, source: str, root: str = "") -> Document:
    """Plain data from YAML text; SpecError naming `source` when it does not parse or breaks a
    limit (`root` prefixes the paths of problems)."""
    return _YamlBuilder(source, root).build(text)


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
        return refuse(self.source, problem, hint, self.root)

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
            self.issues.add(too_deep(self._child_path()))
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
                self.issues.add(long_number(path, text))
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
