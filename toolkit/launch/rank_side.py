"""What a rank started by `toolkit launch` does for its supervisor; `toolkit.init` calls it.

It beats (toolkit.launch.heartbeat) so that a stalled rank ends the job, and, where the ranks
share a launcher's console, tags its output and reports its exit status
(toolkit.launch.rank_output). Outside `toolkit launch` (no TOOLKIT_HEARTBEAT) it does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from toolkit.launch.heartbeat import parse_address, start_beating
from toolkit.launch.rank_output import tag_output
from toolkit.rank_variables import TOOLKIT_HEARTBEAT, TOOLKIT_TAG_OUTPUT

_joined: list[int] = []


def join_supervisor(rank: int, environ: Mapping[str, str] | None = None) -> None:
    """Start beating (and tagging output, when asked to) once per process."""
    environ = os.environ if environ is None else environ
    address = parse_address(environ.get(TOOLKIT_HEARTBEAT, ""))
    if address is None or _joined:
        return
    _joined.append(rank)
    if environ.get(TOOLKIT_TAG_OUTPUT) == "1":
        tag_output(rank, environ[TOOLKIT_HEARTBEAT])
    start_beating(address, rank)
