"""A crash the restart tests inject: `--kill-at STEP --kill-once FILE` makes rank 1 SIGKILL
itself right after optimizer step STEP, as a crashed node would, the first time only (FILE
records that it happened, so the restarted job runs through). `--progress FILE`: rank 0 writes
"PID STEP" there after every step, which scripts/chaos.py reads to time its faults."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kill-at", type=int, default=0, help="rank 1 dies after this step")
    parser.add_argument("--kill-once", help="a file that marks the kill as done")
    parser.add_argument("--progress", help="rank 0 writes 'PID STEP' here after each step")


def maybe_crash(args: argparse.Namespace, rank: int, step: int) -> None:
    """After each step: the progress note, then the crash when this is its step."""
    if args.progress is not None and rank == 0:
        note = Path(args.progress)
        note.with_suffix(".tmp").write_text(f"{os.getpid()} {step}\n")
        note.with_suffix(".tmp").replace(note)
    if rank != 1 or step != args.kill_at or args.kill_once is None:
        return
    marker = Path(args.kill_once)
    if marker.exists():
        return
    marker.write_text(f"rank {rank} killed after step {step}\n")
    os.kill(os.getpid(), signal.SIGKILL)
