"""What the spec's sections are built from: the strict base model, field types, error helpers.

Every section is a frozen pydantic model with unknown keys forbidden and strict types: "yes"
is not true, "3" is not 3, 2.0 is not an integer (YAML and JSON already give real numbers and
booleans, so strictness only refuses what the user did not mean). The few conversions made are
listed at the types below: a list becomes a tuple, and an integer environment value becomes
text.

Validators raise `field_error` (one problem at the field) or `rule_error` (several problems,
paths relative to the model that owns the field); `toolkit.spec.translate` reads both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from toolkit.spec.errors import IssueList, SpecError, SpecIssue
from toolkit.spec.hosts import ENTRY_PATTERN, host_list_issues

CONFIG = ConfigDict(
    strict=True,
    extra="forbid",
    frozen=True,
    populate_by_name=True,
    allow_inf_nan=False,
    revalidate_instances="never",
)


_VALIDATING: ContextVar[bool] = ContextVar("toolkit_spec_validating", default=False)
"""True while a spec model is being validated: nested sections leave their errors to it."""


class Section(BaseModel):
    """A spec model. Validating one, from a file or in Python (`OptimizerSpec(lr=0.1)`), raises
    one SpecError holding every problem; a section nested in another leaves its problems to the
    outermost model, so they are all collected together."""

    model_config = CONFIG

    @model_validator(mode="wrap")
    @classmethod
    def _one_spec_error(
        cls, data: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        if _VALIDATING.get():
            return handler(data)
        token = _VALIDATING.set(True)
        try:
            return handler(data)
        except ValidationError as error:
            raise cls.spec_error(error, data, info.context) from None
        finally:
            _VALIDATING.reset(token)

    @classmethod
    def spec_error(cls, error: ValidationError, data: Any, context: Any) -> SpecError:
        """The SpecError for a failed validation of this model."""
        from toolkit.spec.translate import issues_from

        issues, more = issues_from(error, cls)
        return SpecError(issues, more=more)


def field_error(allowed: str, hint: str) -> PydanticCustomError:
    """One problem with the field being validated."""
    return PydanticCustomError("spec_field", "{allowed}", {"allowed": allowed, "hint": hint})


def rule_error(issues: IssueList | Iterable[SpecIssue]) -> PydanticCustomError:
    """Several problems; their paths are relative to the model that owns the field."""
    kept = tuple(issues.kept if isinstance(issues, IssueList) else issues)
    more = issues.more if isinstance(issues, IssueList) else 0
    return PydanticCustomError(
        "spec_rule", "{count} problems", {"issues": kept, "count": len(kept) + more}
    )


def _exact_int(value: Any) -> Any:
    # Literal[0, 1] in pydantic accepts True and 1.0; a ZeRO stage is written as a number.
    if isinstance(value, bool | float):
        raise field_error("allowed 0, 1, 2, 3", "write the stage as a whole number, e.g. 2")
    return value


ZeroStage = Literal[0, 1, 2, 3]
StrictStage = Annotated[ZeroStage, BeforeValidator(_exact_int)]

MAX_THREADS = 4096


def _threads_setting(value: Any) -> Any:
    # One message for the whole union: pydantic would report each of its branches apart.
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_THREADS:
        return value
    raise field_error(
        f"allowed auto or a whole number from 1 to {MAX_THREADS}",
        "write auto (each rank an even share of its host's cores) or a count, e.g. 4",
    )


ThreadsSetting = Annotated[
    Annotated[int, Field(ge=1, le=MAX_THREADS)] | Literal["auto"],
    BeforeValidator(_threads_setting),
]


def _as_pair(value: Any) -> Any:
    if isinstance(value, list | tuple):
        if len(value) != 2:
            raise field_error("must be a list of 2 numbers in [0, 1)", "write e.g. [0.9, 0.999]")
        return tuple(value)
    return value


_Beta = Annotated[float, Field(ge=0, lt=1)]
Betas = Annotated[tuple[_Beta, _Beta], BeforeValidator(_as_pair)]


@dataclass(frozen=True)
class Text:
    """Annotation for a string that is non-empty, printable and matches `pattern`:

        job_name: Annotated[str, Text("a DNS-1123 label", hint="...", pattern=DNS_LABEL)]

    These strings become argv elements, file names or YAML values: never shell text.
    """

    what: str
    hint: str
    pattern: str | None = None

    def check(self, value: str) -> str:
        bad = not value.strip() or not value.isprintable()
        if bad or (self.pattern is not None and not re.fullmatch(self.pattern, value)):
            raise field_error(f"must be {self.what}", self.hint)
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        json_schema = dict(handler(schema))
        if self.pattern:
            json_schema["pattern"] = f"^(?:{self.pattern})$"
        else:
            json_schema["minLength"] = 1
        return json_schema


def _hosts(value: Any) -> Any:
    if not isinstance(value, list | tuple):
        raise field_error("must be a list of host entries", 'write e.g. ["node1:4", "node2:4"]')
    issues = host_list_issues(tuple(value), "hosts")
    if issues:
        raise rule_error(issues)
    return tuple(value)


Hosts = Annotated[
    tuple[str, ...],
    BeforeValidator(_hosts),
    Field(json_schema_extra={"items": {"type": "string", "pattern": f"^{ENTRY_PATTERN}$"}}),
]


def _names(value: Any) -> Any:
    if not isinstance(value, list | tuple):
        raise field_error("must be a list of class names", 'write e.g. ["GPT2Block"]')
    return tuple(value)


ClassNames = Annotated[
    tuple[
        Annotated[str, Text("a Python class name", "e.g. GPT2Block", r"[A-Za-z_][A-Za-z0-9_]*")],
        ...,
    ],
    BeforeValidator(_names),
]
"""Class names of modules, written as a list."""

_MODULE_PATTERN = re.compile(r"[A-Za-z0-9_*]+(?:\.[A-Za-z0-9_*]+)*")


def _module_patterns(value: dict[str, str]) -> dict[str, str]:
    bad = [name for name in value if not _MODULE_PATTERN.fullmatch(name)]
    if bad:
        raise rule_error(
            [
                SpecIssue(
                    path=f"tensor_plan.{name}",
                    value=name,
                    allowed="a module name, its parts joined by dots, * for any one part",
                    hint='e.g. "layers.*.mlp.up_proj"',
                )
                for name in bad
            ]
        )
    return value


TensorPlan = Annotated[
    dict[str, Literal["colwise", "rowwise"]],
    AfterValidator(_module_patterns),
    Field(json_schema_extra={"propertyNames": {"pattern": f"^{_MODULE_PATTERN.pattern}$"}}),
]
"""Module-name patterns -> how tensor parallelism splits that module's weights."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_values(value: Any) -> Any:
    # `OMP_NUM_THREADS: 4` means the text "4"; booleans and floats must be quoted.
    if isinstance(value, dict):
        return {
            name: str(item) if type(item) is int and abs(item) < 10**30 else item
            for name, item in value.items()
        }
    return value


def _env_names(value: dict[str, str]) -> dict[str, str]:
    issues = IssueList()
    for name, item in value.items():
        if not _ENV_NAME.fullmatch(name) or not item.isprintable():
            issues.add(
                SpecIssue(
                    path=f"env.{name}",
                    value=item,
                    allowed="names are letters, digits and _; values are one printable line",
                    hint="rename the variable, or remove control characters from its value",
                )
            )
    if issues:
        raise rule_error(issues)
    return value


Env = Annotated[
    dict[str, str],
    BeforeValidator(_env_values),
    AfterValidator(_env_names),
    Field(
        json_schema_extra={
            "propertyNames": {"pattern": f"^{_ENV_NAME.pattern}$"},
            "additionalProperties": {"type": ["string", "integer"]},
        }
    ),
]
