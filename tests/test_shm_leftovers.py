"""The engine files a job leaves in /dev/shm: which are the job's (pure logic, a temporary
directory), and a real job under `toolkit`'s supervisor removing its own."""

from __future__ import annotations

import mmap
import time
import uuid
from pathlib import Path

from tests.supervised import rank
from toolkit.launch import run_local
from toolkit.launch.shm_leftovers import SHM_DIRECTORY, leftovers, mapped_files, remove_leftovers


def test_only_new_unmapped_engine_files_are_leftovers(tmp_path: Path) -> None:
    before = tmp_path / "vader_segment.vm.0.1.0"
    before.write_bytes(b"x")
    since = time.time() + 0.01
    time.sleep(0.05)
    deepspeed = tmp_path / "deepspeed_allreduce_buffer_0_127.0.0.1_29500_0"
    vader = tmp_path / "vader_segment.vm.0.2.1"
    other = tmp_path / "torch_shm_segment"
    mapped = tmp_path / "deepspeed_allreduce_buffer_0_127.0.0.1_29500_1"
    for path in (deepspeed, vader, other, mapped):
        path.write_bytes(b"\0" * mmap.PAGESIZE)
    with mapped.open("r+b") as file, mmap.mmap(file.fileno(), mmap.PAGESIZE):
        assert leftovers(since, tmp_path) == [deepspeed, vader]
        assert remove_leftovers(since, tmp_path) == [deepspeed, vader]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [before.name, other.name, mapped.name]
    )


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
