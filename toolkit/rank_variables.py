"""Names of the environment variables the toolkit itself gives each rank.

A neutral module so that the renderers (which write them into the local launcher's plan) and
the launch layer (which reads them in the ranks and sets them when it supervises a job) share
the names without importing each other.
"""

from __future__ import annotations

# The toolkit's own local launcher sets these in each rank; `toolkit.launch.environment`
# reads them before any other launcher's variables.
TOOLKIT_RANK = "TOOLKIT_RANK"
TOOLKIT_WORLD_SIZE = "TOOLKIT_WORLD_SIZE"
TOOLKIT_LOCAL_RANK = "TOOLKIT_LOCAL_RANK"
TOOLKIT_MASTER_ADDR = "TOOLKIT_MASTER_ADDR"
TOOLKIT_MASTER_PORT = "TOOLKIT_MASTER_PORT"

LOCAL_RANK_VARIABLES = (
    TOOLKIT_RANK,
    TOOLKIT_WORLD_SIZE,
    TOOLKIT_LOCAL_RANK,
    TOOLKIT_MASTER_ADDR,
    TOOLKIT_MASTER_PORT,
)
"""One rank's identity under the local launcher: never inherited by a launch started inside it."""

# `toolkit launch` (the supervisor) sets these for every rank under every launcher.
TOOLKIT_HEARTBEAT = "TOOLKIT_HEARTBEAT"
"""host:port of the supervisor's UDP heartbeat listener (toolkit.launch.heartbeat)."""
TOOLKIT_TAG_OUTPUT = "TOOLKIT_TAG_OUTPUT"
"""Set to 1 when the ranks share the launcher's console: each rank then prefixes its own
output lines with "[rank R] " (toolkit.launch.rank_output), so the supervisor can keep each
rank's last lines apart."""

TOOLKIT_JOB_ID = "TOOLKIT_JOB_ID"
"""A token unique to one supervised job: every process of the job carries it, so what a job
left on another host is found and stopped by it (toolkit.launch.reap)."""

SUPERVISOR_VARIABLES = (TOOLKIT_HEARTBEAT, TOOLKIT_TAG_OUTPUT, TOOLKIT_JOB_ID)
"""What the supervisor adds to a job; a launcher must forward them to remote ranks."""

TOOLKIT_HOST = "TOOLKIT_HOST"
"""The host name a rank was started on, as the spec names it (set where the toolkit starts a
rank over ssh itself): heartbeats name it instead of the machine's own hostname."""

TOOLKIT_SPEC = "TOOLKIT_SPEC"
"""The absolute path of the spec `toolkit launch` started the job with (given to every rank
through launch.env), so a script's `toolkit.load_spec()` finds it without being told."""
