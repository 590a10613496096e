"""Pure logic of the bench commands: sizes, bandwidth, which specs a native script matches."""

from __future__ import annotations

import argparse
import socket

import pytest

from toolkit.bench.allreduce import bus_bandwidth
from toolkit.bench.cases import case_for
from toolkit.bench.compare import same_step_as_native, workload_of
from toolkit.bench.native import _bench
from toolkit.bench.step import CaseResult, case_spec
from toolkit.commands.bench import _interface, _size
from toolkit.spec import TrainSpec


@pytest.mark.parametrize(
    ("text", "size"), [("4096", 4096), ("4K", 4096), ("4KiB", 4096), ("64M", 64 << 20)]
)
def test_sizes_are_read_with_their_units(text: str, size: int) -> None:
    assert _size(text) == size


@pytest.mark.parametrize("text", ["", "K", "2", "4X", "-4K", "1.5M"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _size(text)


def test_bus_bandwidth_is_the_ring_share_of_the_message() -> None:
    assert bus_bandwidth(1000, 2, 1.0) == 1000.0  # 2 (n-1)/n = 1 with 2 ranks
    assert bus_bandwidth(1000, 4, 0.5) == 3000.0
    assert bus_bandwidth(1000, 1, 1.0) == 0.0


def _spec(**fields: object) -> TrainSpec:
    return TrainSpec.from_dict({"backend": "ddp", "launch": {"np": 2}, **fields})


def test_only_a_plain_sgd_fp32_step_is_compared_with_a_native_script() -> None:
    sgd = {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}
    assert same_step_as_native(_spec(**sgd), model=None)
    assert not same_step_as_native(_spec(**sgd), model="mine:factory")
    assert not same_step_as_native(_spec(), model=None)  # adamw
    assert not same_step_as_native(_spec(**sgd, clip_grad_norm=1.0), model=None)


@pytest.mark.parametrize(
    "fields",
    [
        {"compression": "fp16"},
        {"ddp": {"sync": {"every_steps": 4, "after": 0}}},
        {"backend": "horovod", "horovod": {"op": "adasum"}},
    ],
    ids=["compression", "local-sgd", "adasum"],
)
def test_a_step_that_reduces_otherwise_is_not_compared_with_a_native_script(
    fields: dict[str, object],
) -> None:
    """The native scripts average uncompressed gradients every step: a ratio against one
    would compare two different steps."""
    sgd = {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}
    assert not same_step_as_native(_spec(**sgd, **fields), model=None)


@pytest.mark.parametrize("name", ["eth0", "tknet", "ib0.8001", "enp5s0f1"])
def test_a_link_is_a_network_interfaces_name(name: str) -> None:
    assert _interface(name) == name


@pytest.mark.parametrize("name", ["", "a/b", "..", "eth 0", "x" * 16, "eth0:1"])
def test_a_link_that_cannot_name_an_interface_is_refused(name: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="network interface"):
        _interface(name)


def test_the_clock_counts_what_a_timed_step_sends_over_the_link() -> None:
    """Loopback's own counter, around steps that each send 1 MB to a local socket; the
    untimed warm-up step's megabyte is not counted."""
    megabyte = b"x" * 1_000_000
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()
        with sender, receiver:

            def step() -> None:
                sender.sendall(megabyte)
                received = 0
                while received < len(megabyte):
                    received += len(receiver.recv(1 << 20))

            clock = _bench.Clock("lo")
            clock.time(step, keep=False)
            for _ in range(3):
                clock.time(step, keep=True)
    sent = clock.record()["sent_bytes_per_step"]
    assert 1_000_000 <= sent < 1_000_000 * 1.5  # headers, and whatever else used loopback


def test_without_a_link_the_clock_records_no_bytes() -> None:
    clock = _bench.Clock()
    clock.time(lambda: None, keep=True)
    assert "sent_bytes_per_step" not in clock.record()
    assert clock.sent_bytes_per_step is None


def test_a_link_this_host_lacks_ends_the_rank_naming_it() -> None:
    with pytest.raises(SystemExit, match="no network interface 'nosuch9'"):
        _bench.Clock("nosuch9")


def test_the_native_workload_is_the_specs_step() -> None:
    spec = _spec(batch={"global": 64, "micro": 16}, optimizer={"name": "sgd", "lr": 0.2})
    workload = workload_of(spec, (8, 4))
    assert (workload.micro, workload.micro_batches, workload.ranks) == (16, 2, 2)
    assert workload.lr == 0.2 and workload.layers == (8, 4)


def test_a_cases_ratio_is_taken_within_each_repetition() -> None:
    result = CaseResult("x", {"native": [10.0, 20.0, 30.0], "toolkit": [11.0, 20.0, 27.0]})
    assert result.ratios == pytest.approx([1.1, 1.0, 0.9])
    assert result.ratio == pytest.approx(1.0)


def test_a_users_pipeline_spec_runs_the_native_scripts_batch() -> None:
    """The batch both sides run is over the data-parallel ranks of the spec as launched: a
    pipeline spec of the user's own (no case fields) has 1 of its 2 ranks."""
    user = TrainSpec.from_dict(
        {"backend": "deepspeed", "parallel": {"pipeline": 2}, "batch": {"global": 64, "micro": 16}}
    )
    case = case_for(user)
    spec = case_spec(user, case)
    batch = spec.batch_for()
    assert (batch.dp, batch.micro, batch.accumulation) == (1, 32, 4)
    assert batch.global_ == case.workload.micro * case.workload.micro_batches
