"""`toolkit doctor --hosts` against the ssh test hosts (127.0.0.2, 127.0.0.3), for real: ssh
with the spec's settings, the probe on each host, a port taken on the rendezvous host, and the
one-line answers to what is wrong. Each run takes a few seconds (ssh and a small probe)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.processes import free_port
from tests.cluster.sshd import SshCluster

ROOT = Path(__file__).resolve().parents[2]
RUN_BOUND_S = 120

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.multiproc,
    pytest.mark.usefixtures("no_orphans", "no_ssh_leftovers"),
]


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolkit", "doctor", "--hosts", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_BOUND_S,
        check=False,
    )


@pytest.fixture
def spec_file(ssh_cluster: SshCluster, tmp_path: Path) -> str:
    """A spec reaching the hosts the way a user's would (launch.ssh, launch.interface lo)."""
    launch = {"hosts": list(ssh_cluster.hosts), **ssh_cluster.launch_section()}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"backend": "ddp", "launch": launch}))
    return str(path)


def report_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert "Traceback" not in done.stderr, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def problems(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The report's problem lines (human form)."""
    lines = done.stdout.splitlines()
    start = lines.index("problems:") + 1
    return [line.strip() for line in lines[start:] if line.startswith("  ")]


def test_every_host_passes_with_the_spec_settings(spec_file: str, ssh_cluster: SshCluster) -> None:
    done = doctor("--spec", spec_file, "--json")
    report = report_of(done)
    assert done.returncode == 0, json.dumps(report, indent=2)
    assert report["ok"] and report["rendezvous"] == {"host": "127.0.0.2", "port": 29500}
    reference = report["reference"]["facts"]
    assert [host["host"] for host in report["hosts"]] == list(ssh_cluster.hosts)
    for host in report["hosts"]:
        facts = host["facts"]
        assert host["ok"] and host["reached"] and host["problems"] == []
        assert facts["python"] == sys.executable
        assert facts["toolkit"]["version"] == reference["toolkit"]["version"]
        assert facts["packages"] == reference["packages"]
        assert facts["interfaces"]["lo"][0]["address"] == "127.0.0.1"
    first, second = report["hosts"]
    assert first["facts"]["port"] == {"port": 29500, "free": True, "error": None}
    assert second["facts"]["port"] is None
    text = doctor("--spec", spec_file)
    assert text.returncode == 0 and text.stdout.rstrip().endswith("all 2 hosts pass")


def test_a_wrong_ssh_port_names_each_host_and_ssh(spec_file: str) -> None:
    closed = free_port(["127.0.0.2", "127.0.0.3"])
    done = doctor("--spec", spec_file, "--ssh-port", str(closed))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = problems(done)
    assert len(lines) == 2, done.stdout
    for host, line in zip(("127.0.0.2", "127.0.0.3"), lines, strict=True):
        assert line.startswith(f"{host}: ssh failed: "), line
        assert f"port {closed}: Connection refused" in line
        assert "FIX: make `ssh -F " in line and f"-p {closed}" in line


def test_a_missing_interface_is_reported_on_every_host(spec_file: str) -> None:
    done = doctor("--spec", spec_file, "--interface", "nosuch0")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = problems(done)
    assert len(lines) == 2, done.stdout
    for host, line in zip(("127.0.0.2", "127.0.0.3"), lines, strict=True):
        assert line.startswith(
            f"{host}: network interface nosuch0 does not exist there (with IPv4: lo 127.0.0.1"
        ), line
        assert "FIX: set launch.interface (--interface)" in line


def test_a_taken_rendezvous_port_is_found_on_the_first_host(spec_file: str) -> None:
    with socket.socket() as listener:
        listener.bind(("", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        done = doctor("--spec", spec_file, "--master-port", str(port), "--json")
    report = report_of(done)
    assert done.returncode == 1
    first, second = report["hosts"]
    assert [p["message"] for p in first["problems"]] == [
        f"rendezvous port {port} is not free there (Address already in use)"
    ]
    assert second["ok"]


def test_flags_alone_reach_the_hosts(ssh_cluster: SshCluster) -> None:
    done = doctor(
        ",".join(ssh_cluster.hosts),
        f"--ssh-config-file={ssh_cluster.config_file}",
        "--interface=lo",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "127.0.0.3               ok" in done.stdout


def test_an_interpreter_missing_everywhere_is_named(spec_file: str, tmp_path: Path) -> None:
    spec = json.loads(Path(spec_file).read_text())
    spec["launch"]["python"] = "/nonexistent/venv/bin/python"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(spec))
    done = doctor("--spec", str(other))
    assert done.returncode == 1
    lines = problems(done)
    assert lines[0].startswith("this machine: cannot run the probe (No such file or directory)")
    for host, line in zip(("127.0.0.2", "127.0.0.3"), lines[1:], strict=True):
        assert line.startswith(f"{host}: no interpreter /nonexistent/venv/bin/python there")


@pytest.mark.parametrize("value", ["a;b", "", "node1,node1", "$(reboot)", "a b"])
def test_a_bad_host_list_is_one_line_and_exit_2(value: str) -> None:
    done = doctor(value)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("toolkit: error: --hosts="), (
        done.stderr
    )
