"""Finding a job's processes while the processes around it end (toolkit.launch.tree)."""

from __future__ import annotations

import os

import psutil
import pytest

from toolkit.launch import tree


def test_ancestors_reach_this_processs_parent() -> None:
    assert os.getppid() in tree.ancestors()
    assert os.getpid() not in tree.ancestors()


def test_an_ancestor_that_ends_meanwhile_ends_the_walk_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the watchdog met when `toolkit launch`, its parent, had just been SIGKILLed."""
    real_parent = psutil.Process.parent

    def parent(process: psutil.Process) -> psutil.Process | None:
        if process.pid != os.getpid():
            raise psutil.NoSuchProcess(process.pid)
        return real_parent(process)

    monkeypatch.setattr(psutil.Process, "parent", parent)
    assert tree.ancestors() == {os.getppid()}
    assert tree.job_processes("no-such-job") == []
