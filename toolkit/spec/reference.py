"""The spec reference page (docs/spec-reference.md), generated from the spec's JSON Schema so
that it says what the models say: every section and key, its type, default and description.
`toolkit spec reference -o docs/spec-reference.md` writes it; a test keeps the committed copy
current."""

from __future__ import annotations

import json
from typing import Any

from toolkit.spec.schema import spec_schema

HEADER = """# Spec reference

Generated from the spec's JSON Schema (`toolkit spec reference -o docs/spec-reference.md`);
do not edit by hand. How specs work, the batch contract and the errors: [spec.md](spec.md).
Rules across fields (the batch contract, which launcher starts which engine) are checked by
`toolkit spec check`, not listed here.
"""


def _type(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in schema:
        return "section"
    if "enum" in schema:
        return " \\| ".join(json.dumps(value) for value in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    if "anyOf" in schema:
        return " \\| ".join(_type(option, defs) for option in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}), defs)}"
    if kind == "object":
        return "mapping"
    return str(kind)


def _default(schema: dict[str, Any]) -> str:
    if "default" not in schema:
        return ""
    text = json.dumps(schema["default"], ensure_ascii=False)
    return f"`{text}`" if len(text) <= 40 else "(see description)"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(properties: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in properties.items():
        description = _cell(field.get("description", ""))
        lines.append(f"| `{name}` | {_type(field, defs)} | {_default(field)} | {description} |")
    return lines


def reference_text() -> str:
    schema = spec_schema()
    defs = schema["$defs"]
    lines = [HEADER, "## Top level", "", *_table(schema["properties"], defs)]
    for name, field in schema["properties"].items():
        ref = field.get("$ref")
        if ref is None:
            continue
        section = defs[ref.rsplit("/", 1)[1]]
        lines += ["", f"## `{name}`", "", _cell(section.get("description", "")), ""]
        lines += _table(section.get("properties", {}), defs)
        for key, inner in section.get("properties", {}).items():
            inner_ref = inner.get("$ref") or next(
                (option["$ref"] for option in inner.get("anyOf", []) if "$ref" in option), None
            )
            if inner_ref is None:
                continue
            nested = defs[inner_ref.rsplit("/", 1)[1]]
            lines += ["", f"### `{name}.{key}`", "", _cell(nested.get("description", "")), ""]
            lines += _table(nested.get("properties", {}), defs)
    return "\n".join(lines) + "\n"
