"""The config, spec and launch commands end to end: output, files, and exit status 2 with one
line on stderr for every bad input (nothing is started)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from toolkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
EVIL = "a; rm -rf /"

SPEC = """
backend: deepspeed
batch: {micro: 4, accumulation: 2}
zero: {stage: 2}
launch: {np: 2}
"""


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture
def bad_spec(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "batch: {global: 250, micro: 16, accumulation: 2}\nlaunch: {np: 8}\n"
        "optimizer: {name: lamb}\n"
    )
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_config_deepspeed_to_stdout_and_file(
    capsys: pytest.CaptureFixture[str], spec_file: Path, tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "config", "deepspeed", "--spec", str(spec_file))
    assert code == 0
    assert json.loads(out)["train_batch_size"] == 16
    code, out, _ = run(capsys, "config", "deepspeed", "--spec", str(spec_file), "--world-size", "8")
    assert json.loads(out)["train_batch_size"] == 64
    target = tmp_path / "ds.json"
    code, out, _ = run(capsys, "config", "deepspeed", "--spec", str(spec_file), "-o", str(target))
    assert code == 0 and out == ""
    assert json.loads(target.read_text())["zero_optimization"]["stage"] == 2


@pytest.mark.parametrize(
    ("kind", "extra", "check"),
    [
        ("horovod", [], lambda out: yaml.safe_load(out)["params"]["fusion_threshold_mb"] == 64),
        ("horovod", ["--env"], lambda out: "HOROVOD_FUSION_THRESHOLD=67108864" in out),
        ("tf", [], lambda out: len(json.loads(out)["tf_config"]) == 2),
        ("tf", ["--index", "1"], lambda out: json.loads(out)["task"]["index"] == 1),
        ("hostfile", [], lambda out: out == "localhost slots=2\n"),
    ],
)
def test_config_kinds(
    capsys: pytest.CaptureFixture[str], spec_file: Path, kind: str, extra: list[str], check: object
) -> None:
    code, out, err = run(capsys, "config", kind, "--spec", str(spec_file), *extra)
    assert code == 0, err
    assert callable(check) and check(out)


def test_config_sbatch_and_mpijob(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "mpi.yaml"
    path.write_text("backend: ddp\nlaunch: {launcher: mpirun, np: 2}\n")
    code, out, _ = run(capsys, "config", "mpijob", "--spec", str(path), "--", "train.py", EVIL)
    assert code == 0
    launcher = yaml.safe_load(out)["spec"]["mpiReplicaSpecs"]["Launcher"]
    assert launcher["template"]["spec"]["containers"][0]["args"][-2:] == ["train.py", EVIL]
    path.write_text("backend: ddp\nlaunch: {launcher: srun, np: 2}\n")
    code, out, _ = run(capsys, "config", "sbatch", "--spec", str(path), "--", "train.py", EVIL)
    assert code == 0 and out.startswith("#!/bin/bash")
    assert "'a; rm -rf /'" in out


def test_config_deepspeed_needs_a_world_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("backend: deepspeed\nbatch: {global: 16, micro: 2}\n")
    code, out, err = run(capsys, "config", "deepspeed", "--spec", str(spec))
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "fixes no world size" in err and "pass --world-size N" in err
    code, out, _ = run(capsys, "config", "deepspeed", "--spec", str(spec), "--world-size", "4")
    assert code == 0
    assert json.loads(out)["gradient_accumulation_steps"] == 2  # 16 = 2 x 2 x 4 ranks


def test_config_presets_check_passes_on_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "config", "presets", "--check", str(ROOT / "ds_configs"))
    assert (code, out) == (0, "")


def test_launch_dry_run_shows_every_rank(
    capsys: pytest.CaptureFixture[str], spec_file: Path
) -> None:
    code, out, _ = run(capsys, "launch", "--spec", str(spec_file), "--dry-run", "--", "t.py", EVIL)
    assert code == 0
    assert "launcher: deepspeed (2 ranks)" in out
    assert "--master_port 29500 t.py 'a; rm -rf /'" in out  # --local_rank=N comes, as natively
    assert "rank 1 on localhost:" in out and "RANK=1" in out
    code, out, _ = run(
        capsys, "launch", "--spec", str(spec_file), "--dry-run", "--json", "--", "t.py", EVIL
    )
    plan = json.loads(out)
    assert plan["argv"][-2:] == ["t.py", EVIL]
    assert [rank["env"]["LOCAL_RANK"] for rank in plan["ranks"]] == ["0", "1"]


def test_launch_runs_every_rank_and_reports_the_one_that_failed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = tmp_path / "local.yaml"
    spec.write_text("backend: ddp\nlaunch: {launcher: local, np: 2}\n")
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys\n"
        "rank = int(os.environ['TOOLKIT_RANK'])\n"
        "print(f'rank {rank} of {os.environ[\"TOOLKIT_WORLD_SIZE\"]}', flush=True)\n"
        "if rank == 1:\n"
        "    sys.exit('rank 1 gives up')\n"
    )
    code, out, err = run(capsys, "launch", "--spec", str(spec), "--", str(script))
    assert code == 1
    assert "rank 0 of 2" in out and "rank 1 of 2" in out
    assert "toolkit launch:" in err and "rank 1 gives up" in err
    script.write_text("print('fine')\n")
    code, out, _ = run(capsys, "launch", "--spec", str(spec), "--", str(script))
    assert code == 0 and out.count("fine") == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["config", "deepspeed", "--spec", "{bad}"],
        ["config", "horovod", "--spec", "{bad}"],
        ["config", "sbatch", "--spec", "{bad}", "--", "t.py"],
        ["launch", "--spec", "{bad}", "--dry-run", "--", "t.py"],
        ["launch", "--spec", "{bad}", "--", "t.py"],
        ["spec", "check", "{bad}"],
        ["config", "deepspeed", "--spec", "{missing}"],
    ],
)
def test_bad_specs_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], bad_spec: Path, tmp_path: Path, argv: list[str]
) -> None:
    filled = [a.format(bad=bad_spec, missing=tmp_path / "nope.yaml") for a in argv]
    code, out, err = run(capsys, *filled)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("toolkit: error: spec error: ")


def test_bad_spec_line_names_every_issue(
    capsys: pytest.CaptureFixture[str], bad_spec: Path
) -> None:
    _, _, err = run(capsys, "config", "deepspeed", "--spec", str(bad_spec))
    assert "optimizer.name=lamb: allowed sgd, adam, adamw" in err  # as the file wrote it
    assert "batch.global=250: must equal micro(16) \u00d7 accumulation(2)" in err


def test_spec_from_deepspeed_round_trip(
    capsys: pytest.CaptureFixture[str], spec_file: Path, tmp_path: Path
) -> None:
    ds = tmp_path / "ds.json"
    assert run(capsys, "config", "deepspeed", "--spec", str(spec_file), "-o", str(ds))[0] == 0
    imported = tmp_path / "imported.yaml"
    code, _, err = run(capsys, "spec", "from-deepspeed", str(ds), "-o", str(imported))
    assert code == 0 and err == ""
    code, out, _ = run(capsys, "config", "deepspeed", "--spec", str(imported))
    assert json.loads(out) == json.loads(ds.read_text())


def test_spec_from_deepspeed_refuses_or_records_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "scheduler": {"type": "X"}}))
    code, out, err = run(capsys, "spec", "from-deepspeed", str(ds), "--world-size", "2")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "scheduler=" in err and "pass --lossy to import anyway and record it" in err
    code, out, err = run(capsys, "spec", "from-deepspeed", str(ds), "--world-size", "2", "--lossy")
    assert code == 0 and "dropped 1 keys" in err
    assert '#   scheduler: {"type": "X"}' in out
    assert yaml.safe_load(out)["launch"] == {"np": 2}
    ds.write_text(json.dumps({"train_batch_size": "auto", "optimizer": {"params": {"lr": "auto"}}}))
    code, out, err = run(capsys, "spec", "from-deepspeed", str(ds))
    assert code == 2 and len(err.splitlines()) == 1
    assert '"auto" needs a value at train_batch_size, optimizer.params.lr HINT' in err
    code, out, err = run(
        capsys,
        "spec",
        "from-deepspeed",
        str(ds),
        "--set",
        "train_batch_size=8",
        "--set",
        "optimizer.params.lr=3e-5",
        "--set",
        "optimizer.type=AdamW",
        "--world-size",
        "2",
    )
    assert code == 0, err
    assert yaml.safe_load(out)["optimizer"]["lr"] == 3e-5


def test_spec_show_and_check(capsys: pytest.CaptureFixture[str], spec_file: Path) -> None:
    code, out, _ = run(capsys, "spec", "check", str(spec_file))
    assert code == 0 and out.startswith("ok: ") and "batch 16" in out
    code, out, _ = run(capsys, "spec", "show", str(spec_file))
    assert yaml.safe_load(out)["zero"]["stage"] == 2


def test_python_m_toolkit_exits_2_on_a_bad_spec(bad_spec: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolkit", "config", "deepspeed", "--spec", str(bad_spec)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("mode", ["--check", "--write"])
def test_config_presets_on_a_wrong_directory_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, mode: str
) -> None:
    for directory in (tmp_path / "missing", tmp_path):  # absent; present but without specs/
        code, out, err = run(capsys, "config", "presets", mode, str(directory))
        assert (code, out) == (2, "")
        assert err.count("\n") == 1 and "no specs/*.yaml" in err and "HINT:" in err
    assert list(tmp_path.iterdir()) == []  # --write wrote nothing


def test_an_unexpected_exception_is_one_line_naming_its_report(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    spec_file: Path,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def broken(spec: object) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr("toolkit.commands.config.hostfile", broken)
    code, out, err = run(capsys, "config", "hostfile", "--spec", str(spec_file))
    assert (code, out) == (70, "")
    assert err.count("\n") == 1 and "internal error" in err and "RuntimeError: boom" in err
    report = Path(err.split("the full traceback is in ", 1)[1].strip())
    assert report.parent == tmp_path / "cache" / "toolkit" / "logs"
    assert "Traceback" in report.read_text() and "RuntimeError: boom" in report.read_text()
