"""`python -m toolkit.launch.probe`: print what this process's launcher told it, as one JSON line.

Used by the real-launcher tests, and handy for checking a new cluster setup: run it under the
launcher and compare the ranks. `--launcher NAME` names the launcher instead of detecting it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from toolkit.errors import ToolkitError
from toolkit.launch.environment import detect_environment, split_local_rank_arg


def main(argv: list[str]) -> int:
    rest, _ = split_local_rank_arg(argv)
    launcher = rest[rest.index("--launcher") + 1] if "--launcher" in rest[:-1] else None
    try:
        environment = detect_environment(os.environ, argv, launcher)
    except ToolkitError as error:
        print(f"toolkit.launch.probe: error: {error.one_line()}", file=sys.stderr)
        return 2
    line = json.dumps(dataclasses.asdict(environment), sort_keys=True) + "\n"
    # One write call: ranks share the launcher's pipe, and one small write is never interleaved.
    os.write(sys.stdout.fileno(), line.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
