"""A crash the restart tests inject: `--kill-at STEP --kill-once FILE` makes rank 1 SIGKILL
itself right after optimizer step STEP, as a crashed node would, the first time only (FILE
records that it happened, so the restarted job runs through)."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kill-at", type=int, default=0, help="rank 1 dies after this step")
    parser.add_argument("--kill-once", help="a file that marks the kill as done")


def maybe_crash(args: argparse.Namespace, rank: int, step: int) -> None:
    if rank != 1 or step != args.kill_at or args.kill_once is None:
        return
    marker = Path(args.kill_once)
    if marker.exists():
        return
    marker.write_text(f"rank {rank} killed after step {step}\n")
    os.kill(os.getpid(), signal.SIGKILL)
