"""Shared test fixtures. Keep this file small: fixtures used by one test module live there."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psutil
import pytest

from toolkit.launch.shm_leftovers import SHM_DIRECTORY, unused_files

# Set by others, not by tests: pytest rewrites PYTEST_CURRENT_TEST at every phase of every
# test, and torch sets TORCHINDUCTOR_CACHE_DIR the first time an optimizer step imports
# torch._dynamo.
_PYTEST_OWNED = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


@pytest.fixture(autouse=True)
def no_environ_leak() -> Iterator[None]:
    """Fail any test that leaves os.environ changed (use monkeypatch.setenv, which undoes
    itself), and put the old values back so that the leak does not spread to later tests."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = sorted(
        key
        for key in (before.keys() | after.keys()) - _PYTEST_OWNED
        if before.get(key) != after.get(key)
    )
    if changed:
        for key in changed:
            if key in before:
                os.environ[key] = before[key]
            else:
                del os.environ[key]
        pytest.fail(f"test changed os.environ and did not restore it: {', '.join(changed)}")


@pytest.fixture(autouse=True)
def nothing_left_in_shared_memory() -> Iterator[None]:
    """Fail any test after which /dev/shm holds a file of this user's that it did not hold
    before and that no live process maps (an engine's, Python's or the toolkit's own, which
    the job's supervisor should have removed), and remove those files first."""
    if not SHM_DIRECTORY.is_dir():
        yield
        return
    before = set(os.listdir(SHM_DIRECTORY))
    yield
    new = [SHM_DIRECTORY / name for name in set(os.listdir(SHM_DIRECTORY)) - before]
    left = unused_files(new)
    for path in left:
        path.unlink(missing_ok=True)
    if left:
        names = ", ".join(path.name for path in left)
        pytest.fail(f"test left files in {SHM_DIRECTORY} (now removed): {names}")


@pytest.fixture
def no_orphans(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For tests that start processes: fail the test if any process it started (found by a
    marker in the environment, so reparented orphans are found too) outlives it, and kill
    those processes first."""
    marker = f"{os.getpid()}-{uuid.uuid4().hex}"
    monkeypatch.setenv("TOOLKIT_TEST_PROCESS_MARK", marker)
    yield
    survivors = []
    for process in psutil.process_iter():
        try:
            marked = process.environ().get("TOOLKIT_TEST_PROCESS_MARK") == marker
            if marked and process.pid != os.getpid() and process.status() != psutil.STATUS_ZOMBIE:
                survivors.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
                process.kill()
        except psutil.Error:
            continue
    if survivors:
        pytest.fail("test left processes running (now killed):\n" + "\n".join(survivors))
