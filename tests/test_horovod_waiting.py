"""How long the Horovod torch backend's waits spin before they sleep (pure logic; the waits
themselves run in tests/test_stalled_engines.py and the allreduce bench)."""

from __future__ import annotations

import pytest

from toolkit.backends.horovod import waiting


def test_a_small_operation_spins_for_the_fixed_budget() -> None:
    assert waiting.spin_budget(0, over_mpi=True) == waiting.SPIN_S
    assert waiting.spin_budget(4, over_mpi=True) == waiting.SPIN_S


def test_a_large_operation_over_mpi_spins_as_long_as_its_bytes_could_take() -> None:
    size = 64 << 20
    budget = waiting.spin_budget(size, over_mpi=True)
    assert budget == pytest.approx(size / waiting.SPIN_BANDWIDTH_BYTES_S)
    assert budget > waiting.SPIN_S
    assert waiting.spin_budget(4 * size, over_mpi=True) == pytest.approx(4 * budget)


def test_over_gloo_every_wait_keeps_the_fixed_budget() -> None:
    assert waiting.spin_budget(256 << 20, over_mpi=False) == waiting.SPIN_S
