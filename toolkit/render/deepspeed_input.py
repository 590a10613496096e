"""Reading a user's DeepSpeed config for `spec from-deepspeed`: key bookkeeping, "auto", --set.

`ConfigReader` walks one mapping of the config and remembers which keys were read, so that
every key left over is reported by its dotted path as written in the config
(`zero_optimization.sub_group_size`). `Report` collects what the importer found: keys it
refuses outright (`errors`), keys the spec does not model (`dropped`: an error in strict mode,
a comment in the written spec with `--lossy`), keys left out because they change no math
(`left_out`, toolkit.render.deepspeed_keys: a comment in the written spec), and notes.

Hugging Face's DeepSpeed integration writes "auto" for values its Trainer fills in;
`apply_settings` fills them from `--set KEY=VALUE` and `auto_paths` lists those still missing.

Keys DeepSpeed itself has removed (it refuses a config holding them) are listed in `REMOVED`,
as in DeepSpeed 0.19.8's `runtime/config.py` (tests compare the two).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.errors import ToolkitError
from toolkit.render import deepspeed_keys as keys
from toolkit.spec import SpecError, SpecIssue
from toolkit.spec.errors import cut, show_value

AUTO = "auto"
AUTO_HINT = "give each with --set KEY=VALUE (what the Hugging Face Trainer fills in)"
LOSSY_HINT = "pass --lossy to import anyway and record it"
MAX_SET_KEY_PARTS = 16
MAX_COMMENT_VALUE_CHARS = 2000

REMOVED: frozenset[str] = frozenset(
    (
        "nebula",
        "compression_training",
        "amp",
        "quantize_training",
        "sparse_gradients",
        "eigenvalue",
        "sparse_attention",
        "elasticity",
        "graph_harvesting",
        "curriculum_learning",
        "progressive_layer_drop",
        "zero_optimization.mics_shard_size",
        "zero_optimization.mics_hierarchical_params_gather",
        "zero_optimization.zeropp_loco_param",
    )
)
"""Config keys DeepSpeed has removed and refuses (dotted paths)."""


@dataclass(frozen=True)
class Dropped:
    """A config key the spec does not model, with its value and why it cannot be kept."""

    path: str
    value: Any
    reason: str

    def comment(self) -> str:
        """One line for the written spec's comment block: the value as JSON, whole unless huge."""
        try:
            shown = cut(json.dumps(self.value, default=str), MAX_COMMENT_VALUE_CHARS)
        except (ValueError, RecursionError):
            shown = show_value(self.value)
        text = f"{self.path}: {shown}  ({self.reason})"
        return text if text.isprintable() else repr(text)


class DeepSpeedConfigError(SpecError):
    """Problems with a DeepSpeed config, each named by its key as written in the config."""

    def __init__(self, issues: Iterable[SpecIssue], *, more: int = 0) -> None:
        super().__init__(issues, more=more)
        self.message = "deepspeed config: " + self.message.removeprefix("spec error: ")
        self.args = (self.one_line(),)


class Report:
    """What importing one config found."""

    def __init__(self) -> None:
        self.errors: list[SpecIssue] = []
        self.dropped: list[Dropped] = []
        self.left_out: list[Dropped] = []
        self.notes: list[str] = []

    def error(self, path: str, value: Any, allowed: str, hint: str) -> None:
        self.errors.append(SpecIssue(path=path, value=value, allowed=allowed, hint=hint))

    def drop(self, path: str, value: Any, reason: str) -> None:
        self.dropped.append(Dropped(path, value, reason))

    def leave_out(self, path: str, value: Any, reason: str) -> None:
        """A key that changes no math and is not rendered: never refused."""
        self.left_out.append(Dropped(path, value, reason))

    def note(self, message: str) -> None:
        self.notes.append(message)

    def strict_issues(self) -> list[SpecIssue]:
        """Every dropped key as an error naming it (strict mode)."""
        return [
            SpecIssue(path=item.path, value=item.value, allowed=item.reason, hint=LOSSY_HINT)
            for item in self.dropped
        ]


def key_name(key: Any) -> str:
    """A config key for a path (keys of a parsed JSON file are strings; others are shown)."""
    return key if isinstance(key, str) else show_value(key)


def join(path: str, key: Any) -> str:
    return f"{path}.{key_name(key)}" if path else key_name(key)


class ConfigReader:
    """One mapping of the config at `path` ("" for the top), remembering which keys were read."""

    def __init__(self, data: Any, path: str, out: Report) -> None:
        self.path = path
        self.out = out
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            out.error(path, data, "must be a mapping", hint="write it as a JSON object {...}")
            data = {}
        self.data = dict(data)
        self.used: set[Any] = set()

    def has(self, key: str) -> bool:
        return key in self.data

    def at(self, key: str) -> str:
        return join(self.path, key)

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def expect(self, key: str, value: Any, reason: str | None = None) -> None:
        """A key the spec models only as `value` (what the toolkit writes): other values drop."""
        self.used.add(key)
        if key in self.data and self.data[key] != value:
            self.out.drop(
                self.at(key), self.data[key], reason or f"the spec models only {show_value(value)}"
            )

    def sub(self, key: str) -> ConfigReader:
        self.used.add(key)
        return ConfigReader(self.data.get(key), self.at(key), self.out)

    def finish(self) -> None:
        """Report every key not read: left out when it changes no math (deepspeed_keys), else
        dropped as removed from DeepSpeed or not modelled by the spec."""
        for key, value in self.data.items():
            if key not in self.used:
                self._unread(self.at(key), value)

    def _unread(self, path: str, value: Any) -> None:
        if path in keys.DEFAULTS:
            default = keys.DEFAULTS[path]
            if type(value) is type(default) and value == default:
                self.out.leave_out(path, value, "DeepSpeed's default, written out")
            else:
                self.out.drop(path, value, f"the spec models only {show_value(default)}")
        elif path in keys.NO_MATH:
            self.out.leave_out(path, value, keys.NO_MATH[path])
        elif not self.path and path.startswith("_"):
            self.out.leave_out(path, value, "a comment (DeepSpeed reads no key that starts with _)")
        elif keys.disabled(value, top_level=not self.path):
            removed = " (DeepSpeed removed it and refuses the key)" if path in REMOVED else ""
            self.out.leave_out(path, value, f"disabled{removed}")
        elif path in REMOVED:
            self.out.drop(path, value, "removed from DeepSpeed, which refuses it")
        else:
            self.out.drop(path, value, "not modelled by the spec")


def auto_paths(config: Any, path: str = "", depth: int = 0) -> Iterator[str]:
    """Dotted paths of every "auto" value (Hugging Face's placeholders), in file order."""
    if depth > 8:
        return
    if isinstance(config, Mapping):
        for key, value in config.items():
            if value == AUTO:
                yield join(path, key)
            else:
                yield from auto_paths(value, join(path, key), depth + 1)


class AutoValuesError(DeepSpeedConfigError):
    """ "auto" values left in a config: one issue per key, one line listing exactly those keys."""

    def __init__(self, paths: Sequence[str]) -> None:
        issues = [
            SpecIssue(path=path, value=AUTO, allowed="needs a value", hint=AUTO_HINT)
            for path in paths
        ]
        super().__init__(issues)
        shown = ", ".join(issue.shown_path() for issue in self.issues[:30])
        more = len(paths) - min(len(self.issues), 30)
        self.message = f'deepspeed config: "auto" needs a value at {shown}' + (
            f" and {more} more" if more else ""
        )
        self.hint = f"{AUTO_HINT}, e.g. --set {self.issues[0].shown_path()}=VALUE"
        self.args = (self.one_line(),)


def parse_setting(text: str) -> tuple[list[str], Any]:
    """`KEY=VALUE` (KEY a dotted config path) -> (path parts, value); VALUE is read as JSON
    (numbers, true/false, null, quoted text, lists) and otherwise kept as text."""
    key, sep, raw = text.partition("=")
    parts = key.split(".")
    if not sep or not all(part.strip() for part in parts) or len(parts) > MAX_SET_KEY_PARTS:
        raise ToolkitError(
            f"--set {cut(text, 60)!r}: must be KEY=VALUE with KEY a dotted DeepSpeed key",
            "e.g. --set optimizer.params.lr=3e-5",
        )
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        value = raw
    if isinstance(value, float) and value != value:  # NaN is no setting
        value = raw
    return parts, value


def apply_settings(config: Any, settings: Sequence[str]) -> Any:
    """A copy of `config` with each `KEY=VALUE` of `settings` set (creating mappings on the way)."""
    if not settings:
        return config
    if not isinstance(config, Mapping):
        return config  # the importer reports the config itself
    result: dict[Any, Any] = dict(config)
    for text in settings:
        parts, value = parse_setting(text)
        node = result
        for index, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = {}
            if not isinstance(child, Mapping):
                where = ".".join(parts[: index + 1])
                raise ToolkitError(
                    f"--set {cut(text, 60)!r}: {cut(where, 60)} is "
                    f"{show_value(child)} in the config, not a mapping",
                    "set a key that exists as a section, or the value itself",
                )
            node[part] = child = dict(child)
            node = child
        node[parts[-1]] = value
    return result
