"""The spec's JSON Schema, from the pydantic models: what `toolkit spec schema` prints.

Committed as docs/spec.schema.json (a test keeps it current), so an editor with a YAML
language server completes and checks spec files: put

    # yaml-language-server: $schema=<path or URL of docs/spec.schema.json>

on the first line of a spec. Descriptions are the fields' own docs; unknown keys are refused
(`additionalProperties: false`), as `toolkit spec check` refuses them. Rules across fields
(the batch contract, which launcher starts which engine) are beyond a schema: `spec check`.
"""

from __future__ import annotations

import json
from typing import Any

from toolkit.spec.model import TrainSpec

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def spec_schema() -> dict[str, Any]:
    """The JSON Schema of a spec file."""
    schema = TrainSpec.model_json_schema(by_alias=True, mode="validation")
    schema["title"] = "toolkit training spec"
    schema["description"] = (
        "One training job for any engine (Horovod, DeepSpeed, tf.distribute, PyTorch DDP). "
        "Check a spec with `toolkit spec check FILE`."
    )
    return {"$schema": DIALECT, **schema}


def schema_text() -> str:
    """`spec_schema` as the text of docs/spec.schema.json."""
    return json.dumps(spec_schema(), indent=2, ensure_ascii=False) + "\n"
