"""The engine files a job leaves in /dev/shm: which are the job's (pure logic, a temporary
directory), and a real job under `toolkit`'s supervisor removing its own."""

from __future__ import annotations

import mmap
import multiprocessing
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.supervised import in_background, rank, under, wait_for_ranks
from toolkit.launch import run_launcher, run_local
from toolkit.launch.shm_leftovers import (
    PYTHON_SEMAPHORES,
    SHM_DIRECTORY,
    leftovers,
    mapped_files,
    remove_leftovers,
)


def test_only_new_unmapped_engine_files_are_leftovers(tmp_path: Path) -> None:
    before = tmp_path / "vader_segment.vm.0.1.0"
    before.write_bytes(b"x")
    since = time.time() + 0.01
    time.sleep(0.05)
    deepspeed = tmp_path / "deepspeed_allreduce_buffer_0_127.0.0.1_29500_0"
    vader = tmp_path / "vader_segment.vm.0.2.1"
    semaphore = tmp_path / "sem.mp-k3x9q2ab"
    joblibs = tmp_path / "sem.loky-4242-k3x9q2ab"
    other = tmp_path / "torch_shm_segment"
    mapped = tmp_path / "deepspeed_allreduce_buffer_0_127.0.0.1_29500_1"
    for path in (deepspeed, vader, semaphore, joblibs, other, mapped):
        path.write_bytes(b"\0" * mmap.PAGESIZE)
    expected = [deepspeed, joblibs, semaphore, vader]
    with mapped.open("r+b") as file, mmap.mmap(file.fileno(), mmap.PAGESIZE):
        assert leftovers(since, tmp_path) == expected
        assert remove_leftovers(since, tmp_path) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [before.name, other.name, mapped.name]
    )


def test_a_live_python_semaphore_is_in_use_and_an_unmapped_one_is_a_leftover() -> None:
    """Named semaphores (multiprocessing in the spawn context, as horovodrun --gloo makes them)
    are mapped under a temporary name glibc has already unlinked; leftovers tells them by
    inode. Their names are sem.mp-* or, once TensorFlow has imported joblib in this process,
    sem.loky-*: both are the sweep's."""
    since = time.time() - 1  # file times lag the clock by up to a tick
    before = set(SHM_DIRECTORY.glob("sem.*"))
    event = multiprocessing.get_context("spawn").Event()
    live = set(SHM_DIRECTORY.glob("sem.*")) - before
    unmapped = SHM_DIRECTORY / f"sem.mp-toolkit-test-{uuid.uuid4().hex[:8]}"
    unmapped.write_bytes(b"\0" * 32)
    try:
        found = set(leftovers(since))
        assert len(live) == 5 and not live & found  # an Event is five semaphores
        assert all(any(p.match(name) for name in PYTHON_SEMAPHORES) for p in live), live
        assert unmapped in found
    finally:
        unmapped.unlink(missing_ok=True)
    assert not event.is_set()


def test_mapped_files_of_one_process(tmp_path: Path) -> None:
    mapped, unmapped = tmp_path / "mapped", tmp_path / "unmapped"
    for path in (mapped, unmapped):
        path.write_bytes(b"\0" * mmap.PAGESIZE)
    with mapped.open("r+b") as file, mmap.mmap(file.fileno(), mmap.PAGESIZE):
        assert mapped_files(tmp_path, processes=["self"]) == {str(mapped)}
        assert mapped_files(tmp_path) == {str(mapped)}
        assert mapped_files(tmp_path, processes=["no-such-process"]) == set()


def test_a_job_removes_the_deepspeed_buffers_its_ranks_leave(tmp_path: Path) -> None:
    name = f"toolkit-test-{uuid.uuid4().hex[:8]}"
    older = SHM_DIRECTORY / f"deepspeed_allreduce_buffer_{name}_older"
    older.write_bytes(b"x")  # another job's, from before this one started
    try:
        time.sleep(0.05)
        result = run_local(rank(tmp_path, "shm", name), 2, timeout=120)
        assert result.ok, result.report()
        assert sorted(SHM_DIRECTORY.glob(f"deepspeed_allreduce_buffer_{name}_*")) == [older]
    finally:
        for path in SHM_DIRECTORY.glob(f"deepspeed_allreduce_buffer_{name}_*"):
            path.unlink()


@pytest.mark.multiproc
def test_a_horovodrun_gloo_job_killed_with_its_launcher_leaves_no_semaphores(
    tmp_path: Path, no_orphans: None
) -> None:
    """horovodrun --gloo holds five named semaphores a rank (/dev/shm/sem.mp-*). SIGKILLed with
    its resource tracker, as the OOM killer or a whole-tree kill ends it, it never unlinks
    them; the supervisor's sweep does once the job has stopped."""
    before = set(SHM_DIRECTORY.glob("sem.mp-*"))
    result = in_background(lambda: run_launcher(under("horovodrun", rank(tmp_path, "sleep"))))
    wait_for_ranks(tmp_path)
    assert len(set(SHM_DIRECTORY.glob("sem.mp-*")) - before) == 10  # 2 ranks' Events
    (launcher,) = [p for p in psutil.Process().children() if "horovodrun" in " ".join(p.cmdline())]
    for process in [launcher, *launcher.children()]:
        if "resource_tracker" in " ".join(process.cmdline()):
            process.kill()
    launcher.kill()
    assert result().returncode != 0
    assert set(SHM_DIRECTORY.glob("sem.mp-*")) - before == set()
