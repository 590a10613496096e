"""The spec's JSON Schema: committed, current, and refusing what `toolkit spec check` refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from toolkit.cli import main
from toolkit.spec.schema import schema_text, spec_schema

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "docs" / "spec.schema.json"
PRESETS = sorted((ROOT / "ds_configs" / "specs").glob("*.yaml"))
VALIDATOR = jsonschema.Draft202012Validator(spec_schema())

VALID: list[dict[str, Any]] = [
    {},
    {
        "backend": "horovod",
        "batch": {"global": 64, "micro": 8},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True},
        "horovod": {"controller": "mpi", "timeline": "tl.json"},
        "launch": {"launcher": "mpirun", "hosts": ["node1:2", "node2:2"], "env": {"OMP": 4}},
    },
    {
        "backend": "tf",
        "tf": {"port": 20000, "local_devices": 2},
        "launch": {"time_limit": "1:30:00"},
    },
]
UNKNOWN_KEYS: list[dict[str, Any]] = [
    {"backend": "ddp", "learning_rate": 0.1},
    {"optimizer": {"name": "adamw", "wieght_decay": 0.01}},
    {"launch": {"np": 2, "nodes": 2}},
]


def test_the_committed_schema_is_current() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == schema_text(), (
        "regenerate it: toolkit spec schema -o docs/spec.schema.json"
    )


def test_spec_schema_command_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == spec_schema()


def test_it_is_a_valid_schema_with_a_description_on_every_field() -> None:
    jsonschema.Draft202012Validator.check_schema(spec_schema())
    schema = spec_schema()
    # Sections are objects; a def such as pydantic's JsonValue (any JSON) has no fields.
    sections = [s for s in (schema, *schema["$defs"].values()) if "properties" in s]
    undocumented = [
        f"{section['title']}.{name}"
        for section in sections
        for name, field in section["properties"].items()
        if not field.get("description")
    ]
    assert not undocumented


@pytest.mark.parametrize("data", VALID + [yaml.safe_load(p.read_text()) for p in PRESETS])
def test_valid_specs_pass_the_schema(data: dict[str, Any], tmp_path: Path) -> None:
    VALIDATOR.validate(data)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert main(["spec", "check", str(spec)]) == 0


@pytest.mark.parametrize("data", UNKNOWN_KEYS)
def test_an_unknown_key_fails_the_schema_as_it_fails_spec_check(
    data: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    errors = list(VALIDATOR.iter_errors(data))
    assert errors and all(error.validator == "additionalProperties" for error in errors)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    capsys.readouterr()
    assert main(["spec", "check", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "unknown key" in err and "HINT:" in err


@pytest.mark.parametrize(
    "data",
    [
        {"seed": "42"},
        {"zero": {"stage": 4}},
        {"launch": {"hosts": ["a b"]}},
        {"launch": {"np": 0}},
        {"launch": {"env": {"BAD-NAME": "x"}}},
        {"precision": "FP16"},
    ],
)
def test_wrong_values_fail_both(data: dict[str, Any], tmp_path: Path) -> None:
    assert list(VALIDATOR.iter_errors(data))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert main(["spec", "check", str(spec)]) == 2


def test_the_committed_reference_page_is_current() -> None:
    from toolkit.spec.reference import reference_text

    committed = (ROOT / "docs" / "spec-reference.md").read_text(encoding="utf-8")
    assert committed == reference_text(), (
        "regenerate it: toolkit spec reference -o docs/spec-reference.md"
    )
