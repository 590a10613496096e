"""`toolkit doctor --hosts`, its pure parts: settings from the spec and the flags, the probe's
facts compared with this machine's, one line per problem. The real checks over ssh are in
tests/cluster/test_doctor_hosts.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolkit.cli import main
from toolkit.doctor import host_probe
from toolkit.doctor.host_checks import compare, network_notes, network_problems
from toolkit.doctor.hosts import PACKAGES, HostCheck, HostsReport, probe_argv, problem_lines
from toolkit.doctor.hosts_format import format_hosts_report
from toolkit.doctor.hosts_request import HostFlags, HostsRequest, hosts_request
from toolkit.doctor.probe_protocol import Problem
from toolkit.errors import ToolkitError
from toolkit.spec import TrainSpec
from toolkit.spec.sections import SshSpec

ROOT = Path(__file__).resolve().parent.parent

LO = {"lo": [{"address": "127.0.0.1", "netmask": "255.0.0.0"}], "eth0": [], "ib0": []}


def facts(**changes: Any) -> dict[str, Any]:
    """What a probe reports for a host like this machine, with `changes`."""
    base: dict[str, Any] = {
        "python": "/venv/bin/python",
        "python_version": "3.11.7",
        "toolkit": {"version": "0.1.0", "path": "/src/toolkit", "error": None},
        "packages": {"torch": "2.13.0+cpu", "deepspeed": "0.19.8", "horovod": None},
        "port": None,
        "interfaces": LO,
        "route": None,
    }
    return base | changes


def spec_with(**launch: Any) -> TrainSpec:
    return TrainSpec.from_dict({"backend": "ddp", "launch": launch})


@pytest.fixture
def key(tmp_path: Path) -> str:
    path = tmp_path / "id_test"
    path.write_text("not a real key\n")
    return str(path)


def test_spec_settings_are_used_and_flags_override_them(key: str) -> None:
    spec = spec_with(
        hosts=["node1:2", "node2:2"],
        ssh={"port": 2222, "identity_file": key},
        interface="eth0",
        master_port=29600,
        python="/opt/venv/bin/python",
    )
    from_spec = hosts_request(spec, HostFlags())
    assert from_spec.hosts == ("node1", "node2")
    assert from_spec.ssh.options() == ["-p", "2222", "-i", key]
    assert (from_spec.interface, from_spec.master_port) == ("eth0", 29600)
    assert (from_spec.rendezvous, from_spec.python) == ("node1", "/opt/venv/bin/python")

    flags = HostFlags(hosts="a:4,b", ssh_port="2200", interface="lo", master_port="30000")
    overridden = hosts_request(spec, flags)
    assert overridden.hosts == ("a", "b")
    assert overridden.ssh.options() == ["-p", "2200", "-i", key]
    assert (overridden.interface, overridden.master_port) == ("lo", 30000)


def test_master_addr_names_the_rendezvous_host() -> None:
    spec = spec_with(hosts=["n1", "n2"], master_addr="n2")
    assert hosts_request(spec, HostFlags()).rendezvous == "n2"


def test_flags_alone_need_no_spec() -> None:
    request = hosts_request(None, HostFlags(hosts="127.0.0.2, 127.0.0.3"))
    assert request.hosts == ("127.0.0.2", "127.0.0.3")
    assert request.ssh == SshSpec()
    assert (request.python, request.master_port, request.interface) == (sys.executable, 29500, None)


@pytest.mark.parametrize(
    ("flags", "start"),
    [
        (HostFlags(hosts="a;b"), '--hosts=\'a;b\': must be "name" or "name:slots"'),
        (HostFlags(hosts=""), "--hosts='': must be"),
        (HostFlags(hosts="a,,b"), "--hosts='': must be"),
        (HostFlags(hosts="a,a"), "--hosts='a': duplicate host"),
        (HostFlags(hosts="$(id)"), "--hosts='$(id)': must be"),
        (HostFlags(hosts="a", ssh_port="ssh"), "--ssh-port='ssh': must be an integer"),
        (HostFlags(hosts="a", ssh_port="0"), "--ssh-port=0: must be >= 1"),
        (HostFlags(hosts="a", master_port="70000"), "--master-port=70000: must be <= 65535"),
        (HostFlags(hosts="a", interface="e th0"), "--interface='e th0': must be a network"),
        (HostFlags(hosts="a", ssh_identity_file="a b"), "--ssh-identity-file='a b': must be"),
        (HostFlags(hosts="a", ssh_config_file="/no/such"), "--ssh-config-file='/no/such': no such"),
        (HostFlags(), "--hosts needs a list of hosts or --spec FILE"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(flags: HostFlags, start: str) -> None:
    with pytest.raises(ToolkitError) as raised:
        hosts_request(None, flags)
    line = raised.value.one_line()
    assert line.startswith(start), line
    assert "\n" not in line and "HINT:" in line


def test_a_missing_key_named_by_the_spec_names_the_spec_field(tmp_path: Path) -> None:
    spec = spec_with(hosts=["n1"], ssh={"identity_file": str(tmp_path / "gone")})
    with pytest.raises(ToolkitError, match=r"^launch\.ssh\.identity_file='.*gone': no such file"):
        hosts_request(spec, HostFlags())


def test_a_spec_without_hosts_has_nothing_to_check() -> None:
    with pytest.raises(ToolkitError, match=r"launch\.hosts is empty"):
        hosts_request(spec_with(), HostFlags())


def request(**changes: Any) -> HostsRequest:
    base: dict[str, Any] = {
        "hosts": ("n1", "localhost"),
        "ssh": SshSpec(port=2222),
        "python": "/venv/bin/python",
        "interface": None,
        "rendezvous": "n1",
        "master_port": 29500,
    }
    return HostsRequest(**(base | changes))


def test_probe_runs_over_ssh_with_the_port_only_on_the_rendezvous_host() -> None:
    remote = probe_argv(request(), "n1")
    assert remote[:4] == ["ssh", "-p", "2222", "-o"] and "n1" in remote
    assert "--port 29500" in remote[-1] and "--route-to n1" in remote[-1]
    local = probe_argv(request(), "localhost")
    assert local[:2] == ["/venv/bin/python", "-c"] and "--port" not in local
    assert local[local.index("--packages") + 1] == ",".join(PACKAGES)
    here = probe_argv(request(), None)
    assert "--route-to" not in here and "--port" not in here


def test_the_probe_reports_a_missing_toolkit_instead_of_failing(tmp_path: Path) -> None:
    """It is sent as `python -c`, so it runs where the toolkit is missing (here: an interpreter
    without site-packages, hence without the toolkit, psutil or any engine) and says so."""
    argv = probe_argv(request(), None)
    done = subprocess.run(
        [sys.executable, "-I", "-S", *argv[1:]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=True,
    )
    reported = json.loads(done.stdout)
    assert reported["toolkit"]["error"] == "ModuleNotFoundError: No module named 'toolkit'"
    assert reported["packages"] == dict.fromkeys(PACKAGES)
    assert reported["interfaces"].startswith("psutil is not importable")
    (problem,) = compare(facts(), reported, "/venv/bin/python")
    assert "cannot import toolkit there" in problem.message


def test_matching_hosts_have_no_problems() -> None:
    assert compare(facts(), facts(), "/venv/bin/python") == []
    assert network_problems(facts(), "lo") == []


@pytest.mark.parametrize(
    ("there", "message"),
    [
        (
            {"packages": {"torch": "2.12.0", "deepspeed": "0.19.8"}},
            "torch 2.12.0 there, 2.13.0+cpu here",
        ),
        ({"packages": {"torch": "2.13.0+cpu"}}, "deepspeed is not installed there, 0.19.8 here"),
        ({"python_version": "3.12.1"}, "Python 3.12.1 there, 3.11.7 here"),
        (
            {"toolkit": {"version": "0.2.0", "path": "/x", "error": None}},
            "toolkit 0.2.0 there, 0.1.0 here",
        ),
    ],
)
def test_each_difference_from_this_machine_is_a_problem(
    there: dict[str, Any], message: str
) -> None:
    problems = compare(facts(), facts(**there), "/venv/bin/python")
    assert [problem.message for problem in problems] == [message]
    assert "install" in problems[0].fix


def test_a_package_missing_here_is_not_required_there() -> None:
    here = facts(packages={"torch": "2.13.0+cpu", "horovod": None})
    assert compare(here, facts(packages={"torch": "2.13.0+cpu", "horovod": "0.28.1"}), "p") == []


def test_toolkit_not_importable_there_is_the_only_version_problem() -> None:
    broken = facts(toolkit={"version": None, "path": None, "error": "ModuleNotFoundError: x"})
    (problem,) = compare(facts(), broken, "/venv/bin/python")
    assert problem.message.startswith("/venv/bin/python cannot import toolkit there")


def test_a_taken_port_and_a_missing_interface_are_problems() -> None:
    taken = facts(port={"port": 29500, "free": False, "error": "Address already in use"})
    (port,) = network_problems(taken, None)
    assert port.message == "rendezvous port 29500 is not free there (Address already in use)"
    (missing,) = network_problems(facts(), "ib1")
    assert missing.message == "network interface ib1 does not exist there (with IPv4: lo 127.0.0.1)"
    (empty,) = network_problems(facts(), "eth0")
    assert empty.message.startswith("network interface eth0 has no IPv4 address there")
    (unknown,) = network_problems(facts(interfaces="psutil is not importable"), "lo")
    assert "psutil" in unknown.message


def test_without_an_interface_the_route_is_information() -> None:
    routed = facts(route={"to": "n1", "address": "127.0.0.1", "interface": "lo", "error": None})
    assert network_notes(routed, None)[0].startswith("traffic to n1 leaves by lo (127.0.0.1)")
    assert network_notes(routed, "lo") == []
    assert network_problems(routed, None) == []


def test_interface_of_an_address() -> None:
    assert host_probe.interface_of("127.0.0.1", LO) == "lo"
    assert host_probe.interface_of("127.0.0.9", LO) == "lo"
    assert host_probe.interface_of("10.0.0.1", LO) is None


def test_port_facts_see_a_listener() -> None:
    with socket.socket() as listener:
        listener.bind(("", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        assert host_probe.port_facts(port)["free"] is False
    assert host_probe.port_facts(port)["free"] is True


def test_package_versions_come_from_metadata() -> None:
    versions = host_probe.package_versions(["psutil", "no_such_package_here"])
    assert versions["psutil"] and versions["no_such_package_here"] is None


def test_every_problem_is_one_line_with_host_and_fix() -> None:
    down = HostCheck(host="n2", problems=[Problem("ssh failed: Connection\nrefused", "start sshd")])
    up = HostCheck(host="n1", facts=facts(), problems=network_problems(facts(), "ib1"))
    report = HostsReport(
        request=request(hosts=("n1", "n2")),
        reference=HostCheck("this machine", facts()),
        hosts=[up, down],
    )
    lines = problem_lines(report)
    assert lines[0].startswith("n1: network interface ib1 does not exist there")
    assert lines[1] == "n2: ssh failed: Connection refused. FIX: start sshd"
    assert all("FIX: " in line and "\n" not in line for line in lines)
    text = format_hosts_report(report)
    assert "2 of 2 hosts failed a check" in text and "n2                      FAIL" in text
    assert report.to_json()["hosts"][1] == {
        "host": "n2",
        "ok": False,
        "reached": False,
        "facts": None,
        "problems": [
            {"message": "ssh failed: Connection\nrefused", "fix": "start sshd", "blocking": True}
        ],
        "notes": [],
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--ssh-port", "22"],
        ["doctor", "--spec", "x.yaml"],
        ["doctor", "--hosts", "a", "--engine", "torch"],
    ],
)
def test_host_options_and_modes_are_checked_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("toolkit: error: "), err


def test_without_the_dependencies_it_says_so_in_one_line(tmp_path: Path) -> None:
    """The engine check runs on the standard library alone; --hosts needs pydantic and PyYAML
    and says so (-S: no site-packages)."""
    done = subprocess.run(
        [sys.executable, "-S", "-m", "toolkit", "doctor", "--hosts", "a"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("toolkit: error: toolkit doctor --hosts needs the toolkit's")
    assert done.stderr.count("\n") == 1
