"""The launch layer: which launcher started this process, and starting and supervising jobs.

Imports no engine. `detect_environment` runs inside each rank; `run_launcher` and `run_local`
run on the machine that starts the job.
"""

from toolkit.launch.environment import (
    LaunchEnvironment,
    detect_environment,
    split_local_rank_arg,
)
from toolkit.launch.supervisor import LaunchResult, free_port, run_launcher, run_local

__all__ = [
    "LaunchEnvironment",
    "LaunchResult",
    "detect_environment",
    "free_port",
    "run_launcher",
    "run_local",
    "split_local_rank_arg",
]
