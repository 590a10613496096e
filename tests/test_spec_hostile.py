"""Hostile and odd input: every reproducer of the reliability issue ends in one SpecError line
with a hint (exit 2 through the CLI), quickly, and values are shown as the file wrote them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.spec import SpecError, TrainSpec, load_spec
from toolkit.spec.errors import MAX_SHOWN, show_value

ROOT = Path(__file__).resolve().parents[1]
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n"
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
)
"""The "billion laughs": nine levels of nine aliases, 9**9 strings once expanded."""

# name -> (file name, text, a path among the issues)
REPRODUCERS: dict[str, tuple[str, str, str]] = {
    "superscript slots": ("s.yaml", 'launch: {hosts: ["node1:²"]}\n', "launch.hosts[0]"),
    "4400-digit slots": (
        "s.yaml",
        f'launch: {{hosts: ["node1:{"9" * 4400}"]}}\n',
        "launch.hosts[0]",
    ),
    "4400-digit np": ("s.yaml", f"launch: {{np: {'9' * 4400}}}\n", "launch.np"),
    "310-digit lr": ("s.yaml", f"optimizer: {{lr: 1{'0' * 309}}}\n", "optimizer.lr"),
    "310-digit lr in JSON": ("s.json", f'{{"optimizer": {{"lr": 1{"0" * 309}}}}}', "optimizer.lr"),
    "lr 1e400": ("s.yaml", "optimizer: {lr: 1e400}\n", "optimizer.lr"),
    "500-deep list": ("s.yaml", "optimizer: {lr: " + "[" * 500 + "]" * 500 + "}\n", "optimizer.lr"),
    "500-deep list in JSON": ("s.json", '{"a": ' + "[" * 500 + "]" * 500 + "}", "a"),
    "billion laughs": ("s.yaml", LAUGHS, "spec"),
    "duplicate backend": ("s.yaml", "backend: ddp\nbackend: tf\n", "backend"),
    "nested duplicate": ("s.yaml", "launch:\n  np: 2\n  np: 4\n", "launch.np"),
    "duplicate in JSON": ("s.json", '{"launch": {"np": 2, "np": 4}}', "launch.np"),
    "python tag": ("s.yaml", "backend: !!python/object:os.system x\n", "spec"),
    "two documents": ("s.yaml", "backend: ddp\n---\nbackend: tf\n", "spec"),
    "alias before anchor": ("s.yaml", "a: *x\nb: &x 1\n", "spec"),
    "list as key": ("s.yaml", "? [a, b]\n: 1\n", "<key>"),
    "np yes": ("s.yaml", "launch: {np: yes}\n", "launch.np"),
    "empty file": ("s.yaml", "", "spec"),
    "number as a variable name": ("s.yaml", "launch: {env: {1: x}}\n", "launch.env.1"),
    "scalar over a blank line": (
        "s.yaml",
        "optimizer:\n  eps: 1.0e-08\n\n    0.001\n",
        "optimizer.eps",
    ),
}


def spec_error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return caught.value


def assert_one_good_line(error: SpecError) -> str:
    line = error.one_line()
    assert "\n" not in line and len(line) < 8000, line[:300]
    assert all(issue.hint for issue in error.issues), [i.path for i in error.issues if not i.hint]
    return line


@pytest.mark.parametrize("name", REPRODUCERS)
def test_reproducer_is_one_line_with_a_hint(name: str, tmp_path: Path) -> None:
    file_name, text, path = REPRODUCERS[name]
    spec = tmp_path / file_name
    spec.write_text(text, encoding="utf-8")
    error = spec_error(spec)
    assert_one_good_line(error)
    assert any(path in issue.path for issue in error.issues), error.one_line()


def test_values_are_shown_as_written(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("launch: {np: yes}\noptimizer: {lr: 1e400, nesterov: on}\nseed: 0x1_0\n")
    line = spec_error(spec).one_line()
    for shown in ("launch.np=yes:", "optimizer.lr=1e400:", "optimizer.nesterov=on:", "seed=0x1_0:"):
        assert shown in line


def test_yaml_1_2_reads_what_yaml_1_1_mangled(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("launch: {time_limit: 1:30:00}\noptimizer: {lr: 1e-3}\n")
    loaded = load_spec(spec)
    assert loaded.launch.time_limit == "1:30:00"  # not 5400 seconds
    assert loaded.optimizer.lr == 0.001  # not the text "1e-3"


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "huge", "binary"])
def test_unreadable_hostfiles_are_refused_without_blocking(kind: str, tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    if kind == "fifo":
        os.mkfifo(hostfile)
    elif kind == "device":
        hostfile = Path("/dev/zero")
    elif kind == "directory":
        hostfile.mkdir()
    elif kind == "huge":
        hostfile.write_text("node1 slots=1\n" * 400_000)
    else:
        hostfile.write_bytes(b"node1 slots=\xff\n")
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"launch": {"hostfile": str(hostfile)}}))
    error = spec_error(spec)
    assert_one_good_line(error)
    assert [issue.path for issue in error.issues] == ["launch.hostfile"]


def test_hostfile_slots_are_ascii_digits(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text(f"node1 slots=²\nnode2 slots={'9' * 4400}\nnode3 slots=2\n")
    (tmp_path / "s.yaml").write_text("launch: {hostfile: hosts}\n")
    error = spec_error(tmp_path / "s.yaml")
    assert_one_good_line(error)
    assert [issue.path for issue in error.issues] == ["launch.hostfile:1", "launch.hostfile:2"]


def test_many_bad_hosts_give_a_short_line() -> None:
    for count in (60_000, 500_000):
        with pytest.raises(SpecError) as caught:
            TrainSpec.from_dict({"launch": {"hosts": ["bad host"] * count}})
        line = assert_one_good_line(caught.value)
        assert len(line) < 8000
    assert f"... and {60_000 - MAX_SHOWN} more" in _line_for(["bad host"] * 60_000)


def _line_for(hosts: list[str]) -> str:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict({"launch": {"hosts": hosts}})
    return caught.value.one_line()


def test_shown_values_are_bounded_whatever_they_hold() -> None:
    nested: list[object] = []
    for _ in range(10_000):
        nested = [nested]
    for value in (nested, "x" * 10**6, 10**5000, {str(i): i for i in range(10**5)}, object()):
        assert len(show_value(value)) <= 80


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolkit", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,  # a generous bound: a hang or an alias bomb would blow far past it
    )


def assert_exit_2_one_line(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stderr[-2000:])
    assert len(done.stderr.splitlines()) == 1 and "HINT:" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("name", ["billion laughs", "310-digit lr in JSON", "500-deep list"])
def test_reproducers_through_the_cli(name: str, tmp_path: Path) -> None:
    file_name, text, _ = REPRODUCERS[name]
    spec = tmp_path / file_name
    spec.write_text(text)
    assert_exit_2_one_line(run_cli("spec", "check", str(spec)))


def test_fifo_spec_and_hostfile_through_the_cli(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert_exit_2_one_line(run_cli("spec", "check", str(fifo)))
    spec = tmp_path / "s.yaml"
    spec.write_text(f"launch: {{hostfile: {fifo}}}\n")
    assert_exit_2_one_line(run_cli("config", "hostfile", "--spec", str(spec)))


def test_deepspeed_config_with_odd_values_through_the_cli(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"offload_optimizer": {"pin_memory": []}}}))
    assert_exit_2_one_line(run_cli("spec", "from-deepspeed", str(config)))
    config.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    assert_exit_2_one_line(run_cli("spec", "from-deepspeed", str(config)))
