"""launch.min_np: the spec rules it needs, and the smaller job a restart starts when hosts are
gone (pure logic; the namespace-host test in tests/cluster runs it for real)."""

from __future__ import annotations

import pytest

from toolkit.launch.elastic import on_hosts_that_answer, ranks_on
from toolkit.launch.restarts import CannotRestart
from toolkit.spec import SpecError, TrainSpec

HOSTS = ["h1:1", "h2:1", "h3:1"]


def spec(launch: dict[str, object], batch: dict[str, object] | None = None) -> TrainSpec:
    return TrainSpec.from_dict(
        {
            "backend": "ddp",
            "batch": batch or {"global": 12, "micro": 2},
            "checkpoint": {"dir": "ckpt"},
            "launch": {"launcher": "torchrun", "hosts": HOSTS, "max_restarts": 1, **launch},
        }
    )


def test_min_np_needs_restarts_hosts_and_a_global_batch() -> None:
    with pytest.raises(SpecError, match=r"launch\.min_np.*launch\.max_restarts"):
        spec({"min_np": 2, "max_restarts": 0})
    with pytest.raises(SpecError, match=r"launch\.min_np.*two or more launch\.hosts"):
        spec({"min_np": 1, "hosts": ["h1:2"]})
    with pytest.raises(SpecError, match=r"launch\.min_np.*world size \(3\)"):
        spec({"min_np": 4})
    with pytest.raises(SpecError, match=r"launch\.min_np.*batch\.global"):
        spec({"min_np": 2}, batch={"micro": 2})
    with pytest.raises(SpecError, match=r"launch\.min_np.*accumulation must follow"):
        spec({"min_np": 2}, batch={"global": 12, "micro": 2, "accumulation": 2})
    assert spec({"min_np": 2}).launch.min_np == 2


def test_a_lost_host_leaves_a_smaller_world_with_the_same_global_batch() -> None:
    whole = spec({"min_np": 2})
    smaller = on_hosts_that_answer(whole, {"h3": "ssh timed out"})
    assert list(smaller.launch.hosts) == ["h1:1", "h2:1"]
    assert ranks_on(smaller.launch.hosts, smaller.launch.np) == 2
    assert (smaller.batch_for().micro, smaller.batch_for().accumulation) == (2, 3)
    assert whole.batch_for().accumulation == 2


def test_every_host_answering_keeps_the_spec_as_it_is() -> None:
    whole = spec({"min_np": 2})
    assert on_hosts_that_answer(whole, {}) is whole


def test_too_few_ranks_left_refuses_the_restart_naming_the_hosts() -> None:
    whole = spec({"min_np": 2})
    with pytest.raises(CannotRestart, match=r"1 rank\(s\) left.*min_np=2.*h2 \(refused\)"):
        on_hosts_that_answer(whole, {"h2": "refused", "h3": "refused"})


def test_a_global_batch_the_smaller_world_cannot_divide_refuses_the_restart() -> None:
    whole = spec({"min_np": 2}, batch={"global": 6, "micro": 2})
    with pytest.raises(CannotRestart, match=r"cannot continue on 2 rank\(s\).*h3"):
        on_hosts_that_answer(whole, {"h3": "gone"})


def test_np_caps_the_world_on_the_hosts_left() -> None:
    whole = TrainSpec.from_dict(
        {
            "backend": "ddp",
            "batch": {"global": 8, "micro": 2},
            "checkpoint": {"dir": "ckpt"},
            "launch": {
                "launcher": "mpirun",
                "hosts": ["a:2", "b:2", "c:2"],
                "np": 4,
                "max_restarts": 1,
                "min_np": 2,
            },
        }
    )
    smaller = on_hosts_that_answer(whole, {"a": "gone"})
    assert smaller.launch.np == 4 and smaller.batch_for().accumulation == 1
    assert ranks_on(["a:2"], 4) == 2
