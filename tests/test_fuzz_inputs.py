"""Fuzzing every parser of user input: nothing but the toolkit's own error may escape.

Targets: spec data through `TrainSpec.from_dict`; YAML and JSON spec text through `load_spec`;
hostfiles through a spec that names one; DeepSpeed configs (data and JSON text) through the
`spec from-deepspeed` importer. Each target gets `EXAMPLES` examples (2,000 by default, bounded
so the file runs in about a minute on two cores); set TOOLKIT_FUZZ_EXAMPLES for a longer run:

    TOOLKIT_FUZZ_EXAMPLES=50000 pytest -m fuzz tests/test_fuzz_inputs.py

A failure is an exception other than SpecError, an issue without a hint, or a message that is
not one short line. Hypothesis keeps no database here (nothing is written into the repository);
a failure prints its reproducing example.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import string
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.errors import ToolkitError
from toolkit.render.deepspeed import deepspeed_config
from toolkit.render.deepspeed_import import spec_from_deepspeed
from toolkit.render.deepspeed_input import apply_settings
from toolkit.spec import SpecError, TrainSpec, load_spec
from toolkit.spec.errors import MAX_MESSAGE_CHARS
from toolkit.spec.load import parse_document

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("TOOLKIT_FUZZ_EXAMPLES", "2000"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
PRESETS = Path(__file__).resolve().parents[1] / "ds_configs" / "specs"
MAX_LINE = MAX_MESSAGE_CHARS + 1000
"""The message's bound, plus room for its first issue (always shown) and the count."""

VALID: list[dict[str, Any]] = [
    {},
    {"backend": "tf", "launch": {"np": 2}},
    {
        "backend": "horovod",
        "batch": {"global": 64, "micro": 8},
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True},
        "horovod": {"controller": "mpi", "compression": "fp16", "timeline": "tl.json"},
        "launch": {"launcher": "mpirun", "hosts": ["node1:2", "node2:2"], "env": {"A": "b"}},
    },
    {
        "backend": "deepspeed",
        "precision": "fp16",
        "zero": {
            "stage": 3,
            "offload_optimizer": "nvme",
            "offload_params": "nvme",
            "nvme_path": "/n",
        },
        "parallel": {"pipeline": 1},
        "pipeline": {"partition": "type:Linear"},
        "launch": {"hosts": ["node1:4", "node2:4"], "partition": "gpu", "time_limit": "1-02:00:00"},
    },
    {"backend": "ddp", "launch": {"launcher": "srun", "np": 3}, "lr_scaling": "linear"},
]
VALID += [yaml.safe_load(path.read_text()) for path in sorted(PRESETS.glob("*.yaml"))]

ODD_TEXT = [
    "²", "٣", "1e400", "-0", "0x1F", "0o17", "1_000", "1:30:00", "yes", "on", "~", "", " ",
    "node1:²", "node1:" + "9" * 50, "a; rm -rf /", "$(id)", "\x00", "\t", "\u202e", "\ud800",
    "auto", "none", "nvme", "gloo", "mpi", "type:(", "type:[a-", "x" * 300, "<<", "global",
]  # fmt: skip
PLAUSIBLE = [
    *[0, 1, 2, 3, 4, 8, 64, 65535, 65536, 0.5, 1e-3, 2.0, True, False, None, "auto"],
    *["none", "cpu", "nvme", "gloo", "mpi", "sgd", "adamw", "fp16", "ring", "linear"],
    *["tf", "ddp", "horovod", "deepspeed", "local", "mpirun", "srun", "torchrun"],
    *[["node1:2", "node2:2"], ["localhost:3"], ["a:1", "a:2"], [0.8, 0.9], "hosts.txt"],
]  # fmt: skip
"""Values that often make a mutated spec valid again, so deep paths are reached too."""


class Hostile:
    """Random values of every shape a file can hold, from a Random hypothesis seeds (so an
    example is reproducible). Plain Python for speed: thousands of examples per target must
    fit in seconds."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def scalar(self) -> Any:
        rng = self.rng
        kind = rng.randrange(10)
        if kind == 0:
            return rng.choice([None, True, False])
        if kind == 1:
            return rng.randint(-5, 70_000)
        if kind == 2:
            return rng.choice([-1, 1]) * 2 ** rng.randrange(1000)
        if kind == 3:
            return rng.choice(
                [0.0, -0.0, 1e-300, 1e300, math.inf, -math.inf, math.nan, rng.random()]
            )
        if kind == 4:
            return "".join(chr(rng.randrange(0x20, 0x2FFFF)) for _ in range(rng.randrange(8)))
        if kind == 5:
            return "".join(rng.choice(string.printable) for _ in range(rng.randrange(12)))
        if kind in (6, 7):
            return rng.choice(ODD_TEXT)
        return copy.deepcopy(rng.choice(PLAUSIBLE))

    def value(self, depth: int = 0) -> Any:
        rng = self.rng
        kind = rng.randrange(12)
        if kind == 0 and depth < 3:
            return [self.value(depth + 1) for _ in range(rng.randrange(4))]
        if kind == 1 and depth < 3:
            return {self.key(): self.value(depth + 1) for _ in range(rng.randrange(4))}
        if kind == 2 and rng.randrange(10) == 0:
            return nested(rng.randrange(600))
        return self.scalar()

    def key(self) -> Any:
        if self.rng.randrange(8) == 0:
            return self.rng.choice([0, None, True, 1.5, "", "a.b", "<<", "global", "np"])
        return "".join(self.rng.choice(string.ascii_lowercase + "_") for _ in range(6))

    def mutate(self, data: Any) -> Any:
        """`data` with 1-3 values replaced, keys deleted or keys added."""
        rng = self.rng
        data = copy.deepcopy(data)
        for _ in range(rng.randint(1, 3)):
            paths = paths_of(data)
            action = rng.choice(["set", "set", "set", "delete", "add"])
            if not paths or action == "add":
                mappings = [p for p in [(), *paths] if isinstance(get(data, p), dict)]
                if mappings:
                    get(data, rng.choice(mappings))[self.key()] = self.value()
                continue
            path = rng.choice(paths)
            parent = get(data, path[:-1])
            if action == "delete" and isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent[path[-1]] = self.value()
        return data

    def spec(self) -> Any:
        if self.rng.randrange(10) == 0:
            return self.value()
        return self.mutate(self.rng.choice(VALID))


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


RANDOMS = st.randoms(use_true_random=True)
"""A Random seeded by hypothesis: a failure prints its seed, and drawing costs nothing (an
instrumented Random costs hypothesis bookkeeping on every call, ten times the test itself)."""


def check_error(error: SpecError) -> None:
    """The toolkit's error, as users see it: one bounded line, a hint on every issue."""
    line = error.one_line()
    assert "\n" not in line and len(line) < MAX_LINE, line[:500]
    missing = [issue.path for issue in error.issues if not issue.hint]
    assert not missing, f"issues without a hint: {missing}: {line[:500]}"


OUTCOMES: Counter[tuple[str, str]] = Counter()
"""(target, accepted | refused) -> examples, for the last test of this file."""


def only_spec_errors(target: str, call: Callable[[], object]) -> None:
    try:
        call()
    except SpecError as error:
        check_error(error)
        OUTCOMES[target, "refused"] += 1
    else:
        OUTCOMES[target, "accepted"] += 1


def paths_of(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += paths_of(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += paths_of(value, (*prefix, index))
    return found


def get(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


@pytest.fixture(scope="module")
def where(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every example's files (creating one per example costs more than
    the example)."""
    return tmp_path_factory.mktemp("fuzz")


# -- spec data -------------------------------------------------------------------------------


@FUZZ
@given(RANDOMS)
def test_spec_data(rng: random.Random) -> None:
    data = Hostile(rng).spec()
    only_spec_errors("spec data", lambda: TrainSpec.from_dict(data))


# -- YAML and JSON text ----------------------------------------------------------------------

YAML_BITS = [
    "&a ", "*a", "*b", "!!python/object:os.system ", "!!binary ", "!!int ", "!!str ", "! ",
    "<<: *a\n", "? ", "---\n", "...\n", "%YAML 1.1\n", "- ", ": ", "{", "}", "[", "]", ",",
    "\n  ", "\t", "#", "'", '"', "|\n  ", ">\n  ", "yes", "1:30:00", "0x1F", ".inf", "~",
    "1" * 400, "[" * 200, "\ufeff", "\x85", "\u2028", "\ud800",
]  # fmt: skip


def spec_text(rng: random.Random, *, as_json: bool) -> str:
    """A spec as text, valid or not, then cut and spliced with pieces of YAML syntax."""
    hostile = Hostile(rng)
    data = hostile.spec()
    try:
        if as_json:
            text = json.dumps(data, allow_nan=rng.random() < 0.5)
        else:
            text = yaml.dump(data, Dumper=yaml.CSafeDumper, default_flow_style=rng.random() < 0.5)
    except (TypeError, ValueError, RecursionError, yaml.YAMLError):
        text = str(data)[:2000]
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        position = rng.randrange(len(text) + 1)
        bit = rng.choice(YAML_BITS) if rng.random() < 0.7 else str(hostile.scalar())
        text = text[:position] + bit + text[position + rng.randrange(5) :]
    if as_json and rng.random() < 0.1 and text.startswith("{") and len(text) > 2:
        text = text[:-1] + ', "backend": "ddp"}'  # a duplicate key, or not
    return text


def load_text(text: str, path: Path) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except UnicodeEncodeError:  # lone surrogates: no file can hold them; parse the text
        only_spec_errors(path.name, lambda: parse_document(text, path.name))
        return
    only_spec_errors(path.name, lambda: load_spec(path))


@FUZZ
@given(RANDOMS)
def test_yaml_spec_files(where: Path, rng: random.Random) -> None:
    load_text(spec_text(rng, as_json=False), where / "spec.yaml")


@FUZZ
@given(RANDOMS)
def test_json_spec_files(where: Path, rng: random.Random) -> None:
    load_text(spec_text(rng, as_json=True), where / "spec.json")


# -- hostfiles -------------------------------------------------------------------------------

HOST_NAMES = ["node1", "node-2", "10.0.0.1", "localhost", "a..b", "-x", "nöde", "n;rm", "$(id)"]
SLOTS = ["1", "4", "0", "-1", "²", "٣", "9" * 4400, "65536", "65537", "x", "", "0x10", " 2"]
SEPARATORS = [" slots=", ":", "  slots = ", "\tslots=", " slots", " ", "::", " slots=4 slots="]


def hostfile_text(rng: random.Random) -> str:
    """A hostfile: a third of them well-formed (distinct hosts, good slots, comments), the
    rest with hostile lines mixed in."""
    hostile = Hostile(rng)
    if rng.random() < 1 / 3:
        count = rng.randint(1, 8)
        lines = [
            f"node{i}{rng.choice([' slots=', ':', '  slots = '])}{rng.randint(1, 8)}"
            for i in range(count)
        ]
        lines.insert(rng.randrange(count + 1), rng.choice(["", "# rack 1", "node9 # bare"]))
        return "\n".join(lines)
    lines = []
    for _ in range(rng.randrange(12)):
        kind = rng.randrange(10)
        if kind == 0:
            lines.append(rng.choice(["", "# comment", "   ", "node1 # trailing", "\x0c"]))
        elif kind == 1:
            lines.append(str(hostile.scalar()))
        else:
            name = rng.choice(HOST_NAMES) if rng.random() < 0.8 else f"n{rng.randrange(99)}"
            lines.append(name + rng.choice(SEPARATORS) + rng.choice(SLOTS))
    if rng.randrange(200) == 0:  # past 65,536 hosts, and sometimes past the 4 MiB limit
        lines *= rng.randrange(1, 30_000)
    return "\n".join(lines)


HOSTFILE_SPECS = [
    {"launch": {"hostfile": "hosts", **launch}}
    for launch in ({}, {"launcher": "mpirun"}, {"launcher": "local"}, {"np": 4})
]


@FUZZ
@given(RANDOMS)
def test_hostfiles(where: Path, rng: random.Random) -> None:
    (where / "hosts").write_bytes(hostfile_text(rng).encode("utf-8", "surrogatepass"))
    spec = where / f"hosts-{rng.randrange(len(HOSTFILE_SPECS))}.json"
    if not spec.exists():
        spec.write_text(json.dumps(HOSTFILE_SPECS[int(spec.stem.split("-")[1])]))
    only_spec_errors("hostfile", lambda: load_spec(spec))


# -- DeepSpeed configs -----------------------------------------------------------------------

DEEPSPEED_CONFIGS = [
    deepspeed_config(TrainSpec.from_dict(data))
    for data in VALID
    if data.get("backend") == "deepspeed"
]
DEEPSPEED_CONFIGS.append(
    {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "Adam", "params": {"lr": 3e-5, "betas": [0.9, 0.999]}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu", "pin_memory": True},
            "offload_optimizer": {"device": "cpu"},
            "reduce_bucket_size": 5e8,
            "cpu_offload": False,
        },
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
        "gradient_clipping": 1.0,
        "parallel": {"pipeline": 2},
        "pipeline": {"partition": "best"},
    }
)


@FUZZ
@given(RANDOMS)
def test_deepspeed_configs(rng: random.Random) -> None:
    hostile = Hostile(rng)
    config = (
        hostile.value() if rng.randrange(10) == 0 else hostile.mutate(rng.choice(DEEPSPEED_CONFIGS))
    )
    world_size = rng.choice([None, None, 1, 2, 8, 64])

    def run() -> None:
        data = config
        if rng.random() < 0.3:  # through the parser, as `spec from-deepspeed` reads a file
            try:
                text = json.dumps(config)
            except (TypeError, ValueError, RecursionError):
                return
            data = parse_document(text, "ds.json", root="deepspeed").data
        spec_from_deepspeed(data, world_size=world_size, lossy=rng.random() < 0.5)

    only_spec_errors("deepspeed config", run)


HF_AUTO_CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
}
HF_SETTINGS = {
    "train_batch_size": "16",
    "train_micro_batch_size_per_gpu": "4",
    "gradient_accumulation_steps": "2",
    "gradient_clipping": "1.0",
    "optimizer.params.lr": "3e-5",
    "optimizer.params.weight_decay": "0.0",
    "bf16.enabled": "true",
    "zero_optimization.reduce_bucket_size": "5e8",
}


def setting_text(rng: random.Random, hostile: Hostile) -> str:
    """One --set argument: a real key with a good or hostile value, or hostile text."""
    roll = rng.randrange(4)
    key, value = rng.choice(list(HF_SETTINGS.items()))
    if roll == 0:
        return key + "=" + value
    if roll == 1:
        return key + "=" + (json.dumps(hostile.scalar(), default=str) if rng.random() < 0.8 else "")
    if roll == 2:
        return str(hostile.scalar())
    return ".".join(str(hostile.scalar()) for _ in range(rng.randrange(1, 4))) + "=1"


@FUZZ
@given(RANDOMS)
def test_deepspeed_settings(rng: random.Random) -> None:
    """`spec from-deepspeed --set KEY=VALUE`: any settings end in a spec or a one-line error."""
    hostile = Hostile(rng)
    settings = [key + "=" + value for key, value in HF_SETTINGS.items() if rng.random() < 0.9]
    settings += [setting_text(rng, hostile) for _ in range(rng.randrange(4))]
    rng.shuffle(settings)

    def run() -> None:
        try:
            spec_from_deepspeed(apply_settings(HF_AUTO_CONFIG, settings), world_size=2)
        except SpecError:
            raise
        except ToolkitError as error:  # a malformed --set: the CLI's one line, with a hint
            line = error.one_line()
            assert error.hint and "\n" not in line and len(line) < MAX_LINE, line[:500]
            raise SpecError.single("--set", settings, "refused", "fuzz") from None

    only_spec_errors("deepspeed --set", run)


def test_each_target_saw_valid_and_invalid_input() -> None:
    """Not vacuous: every target that ran above met input it accepted and input it refused
    (runs last in this file; targets not selected in this run are not judged)."""
    ran = {target for target, _ in OUTCOMES}
    if not ran:
        pytest.skip("no fuzz target ran in this session")
    for target in ran:
        assert OUTCOMES[target, "accepted"] > 0, f"{target} never met valid input"
        assert OUTCOMES[target, "refused"] > 0, f"{target} never met invalid input"
