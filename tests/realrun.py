"""Run an example script through a real launcher and read what its ranks report.

Every rank prints a JSON line with its weights digest; rank 0 also prints the run's metrics.
Launchers prefix lines differently (horovodrun: "[1]<stdout>:"), so JSON objects are found
anywhere in a line. A failure shows the command and the tail of everything it printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PYTHON = sys.executable
TORCH_EXAMPLE = str(ROOT / "hvd_examples" / "torch_digits.py")
TF_EXAMPLE = str(ROOT / "hvd_examples" / "tf_digits.py")
SPECS = ROOT / "hvd_examples" / "specs"
RUN_TIMEOUT_S = 420
DECODER = json.JSONDecoder()


def mpirun() -> list[str]:
    flags = ["--oversubscribe", "--bind-to", "none"]
    if os.getuid() == 0:
        flags.insert(0, "--allow-run-as-root")
    return ["mpirun", *flags, "-np", "2"]


def spec(name: str) -> str:
    return str(SPECS / f"{name}.yaml")


def rank_env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }


@dataclass
class RunOutput:
    argv: list[str]
    returncode: int
    output: str
    reports: list[dict[str, Any]]

    def explain(self) -> str:
        tail = "\n".join(self.output.splitlines()[-40:])
        return f"command: {self.argv}\nexit: {self.returncode}\n--- last output ---\n{tail}"

    @property
    def metrics(self) -> dict[str, Any]:
        found = [r for r in self.reports if "accuracy" in r]
        assert len(found) == 1, self.explain()
        return found[0]

    @property
    def digests(self) -> dict[int, str]:
        return {r["rank"]: r["weights_sha256"] for r in self.reports if "weights_sha256" in r}


def run(
    argv: list[str],
    *,
    timeout: float = RUN_TIMEOUT_S,
    cwd: Path = ROOT,
    unset: tuple[str, ...] = (),
) -> RunOutput:
    """`argv` in rank_env(), without the variables named in `unset`."""
    env = {name: value for name, value in rank_env().items() if name not in unset}
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return RunOutput(
        argv=argv, returncode=done.returncode, output=done.stdout, reports=json_objects(done.stdout)
    )


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object in the text, also when two ranks' lines were printed on one line."""
    found = []
    for line in text.splitlines():
        start = line.find("{")
        while start != -1:
            try:
                value, length = DECODER.raw_decode(line[start:])
            except json.JSONDecodeError:
                start = line.find("{", start + 1)
                continue
            if isinstance(value, dict):
                found.append(value)
            start = line.find("{", start + length)
    return found


def assert_trained(result: RunOutput, *, world_size: int, min_accuracy: float) -> None:
    """Exit 0, loss went down, accuracy reached, and every rank holds the same weights."""
    assert result.returncode == 0, result.explain()
    metrics = result.metrics
    assert metrics["world_size"] == world_size, result.explain()
    assert metrics["final_loss"] < 0.5 * metrics["first_loss"], result.explain()
    assert metrics["accuracy"] >= min_accuracy, result.explain()
    digests = result.digests
    assert sorted(digests) == list(range(world_size)), result.explain()
    assert len(set(digests.values())) == 1, f"ranks ended with different weights: {digests}"
