"""A rank for the supervisor tests: no engine, but it joins the supervisor as `toolkit.init`
does (heartbeats, and tagged output under a launcher), writes its pid to PIDDIR/RANK, then:

    sleep              prints "rank up" and sleeps until stopped
    fail RANK STATUS   rank RANK writes to stderr and exits with STATUS; the others sleep
    raise RANK         rank RANK raises an exception; the others sleep
    progress           rank 0 draws a carriage-return progress bar, then waits for PIDDIR/go
    detach THEN        starts a process that leaves the job's process tree (double fork, a
                       session of its own) and writes its pid to PIDDIR/detached-RANK; then
                       THEN is "exit" (exit 0) or "sleep" (sleep until stopped)
    shm NAME [THEN]    leaves /dev/shm/deepspeed_allreduce_buffer_NAME_RANK behind, as
                       DeepSpeed's CPU accelerator does; then THEN, "exit" (the default) or
                       "sleep"
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from toolkit.launch import detect_environment, join_supervisor, split_local_rank_arg


def main(piddir: str, action: str, *args: str) -> int:
    rank = detect_environment(os.environ, sys.argv).rank
    join_supervisor(rank)
    (Path(piddir) / str(rank)).write_text(str(os.getpid()))
    print(f"rank up {rank}", flush=True)
    if action == "fail" and rank == int(args[0]):
        time.sleep(1)
        print(f"rank {rank} is failing now", file=sys.stderr, flush=True)
        return int(args[1])
    if action == "raise" and rank == int(args[0]):
        time.sleep(1)
        raise RuntimeError(f"rank {rank} broke")
    if action == "progress" and rank == 0:
        for step in range(3):
            sys.stderr.write(f"\rstep {step}/3")
            sys.stderr.flush()
            time.sleep(0.1)
        while not (Path(piddir) / "go").exists():
            time.sleep(0.1)
        sys.stderr.write("\n")
        return 0
    if action == "shm":
        Path(f"/dev/shm/deepspeed_allreduce_buffer_{args[0]}_{rank}").write_bytes(b"\0" * 4096)
        if args[1:] != ("sleep",):
            return 0
    if action == "detach":
        detach(Path(piddir) / f"detached-{rank}")
        if args[0] == "exit":
            return 0
    while True:
        time.sleep(0.5)


DAEMON = """
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
with open(sys.argv[1] + ".tmp", "w") as out:
    out.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(0.5)
"""


def detach(pidfile: Path) -> None:
    """Start a daemon whose parent exits at once: init adopts it, so no parent link leads
    from this rank to it. Returns once it has written its pid."""
    subprocess.run([sys.executable, "-c", DAEMON, str(pidfile)], check=True)
    while not pidfile.exists():
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(*split_local_rank_arg(sys.argv[1:])[0]))
