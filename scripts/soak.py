"""Soak: run each engine's 2-rank example job many times and count aborts at exit.

Not a CI test (it takes an hour at the default count): it is the evidence that a rare crash at
interpreter exit ("terminate called without an active exception", SIGABRT) is gone. Each run is
the README's example under `toolkit launch` with the real launcher the spec names; a run counts
as an abort when any process died of SIGABRT or printed "terminate called". The report lists,
per engine, runs, passes, aborts and other failures, with the tail of the first failure.

    .venv/bin/python scripts/soak.py --runs 50 --out docs/soak
    .venv/bin/python scripts/soak.py --runs 5 --engines zero1 ddp   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SPECS = ROOT / "hvd_examples" / "specs"
ABORT_MARKERS = ("terminate called", "Aborted", "SIGABRT", "signal 6")
RUN_TIMEOUT_S = 600

# engine label -> (spec file, example script); the spec names the launcher.
JOBS: dict[str, tuple[str, str]] = {
    "ddp": ("ddp.yaml", "torch_digits.py"),
    "horovod": ("horovod.yaml", "torch_digits.py"),
    "zero1": ("zero1.yaml", "torch_digits.py"),
    "zero2": ("zero2.yaml", "torch_digits.py"),
    "zero3": ("zero3.yaml", "torch_digits.py"),
    "pipeline": ("pipeline.yaml", "torch_digits.py"),
    "horovod-tf": ("horovod_tf.yaml", "tf_digits.py"),
    "tf-multiworker": ("tf_multiworker.yaml", "tf_digits.py"),
}


@dataclass
class Tally:
    engine: str
    runs: int = 0
    passed: int = 0
    aborts: int = 0
    other_failures: int = 0
    seconds: list[float] = field(default_factory=list)
    first_failure: str = ""


def run_once(engine: str, epochs: int) -> tuple[str, float, str]:
    spec_file, script = JOBS[engine]
    spec = str(SPECS / spec_file)
    argv = [
        str(BIN / "toolkit"), "launch", "--spec", spec, "--",
        str(ROOT / "hvd_examples" / script), "--spec", spec, "--epochs", str(epochs),
        "--min-accuracy", "0",
    ]  # fmt: skip
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "other", time.monotonic() - start, f"timed out after {RUN_TIMEOUT_S}s"
    seconds = time.monotonic() - start
    output = done.stdout + done.stderr
    tail = "\n".join(output.splitlines()[-15:])
    if any(marker in output for marker in ABORT_MARKERS) or done.returncode in (-6, 134, 250):
        return "abort", seconds, tail
    return ("pass" if done.returncode == 0 else "other"), seconds, tail


def write_report(tallies: list[Tally], out: Path, runs: int, epochs: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {"runs_per_engine": runs, "epochs": epochs, "engines": [asdict(t) for t in tallies]}
    (out / "soak.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [
        "# Soak: aborts at exit",
        "",
        f"Each engine's 2-rank example, {runs} runs of {epochs} epoch(s) under `toolkit launch`",
        f"(`{' '.join(sys.argv)}`).",
        "",
        "| engine | runs | passed | aborts | other failures | median s |",
        "|---|---|---|---|---|---|",
    ]
    for t in tallies:
        median = sorted(t.seconds)[len(t.seconds) // 2] if t.seconds else float("nan")
        lines.append(
            f"| {t.engine} | {t.runs} | {t.passed} | {t.aborts} | {t.other_failures} | "
            f"{median:.1f} |"
        )
    for t in tallies:
        if t.first_failure:
            lines += ["", f"First failure of {t.engine}:", "", "```", t.first_failure, "```"]
    (out / "SOAK.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--engines", nargs="*", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--out", default="reports/soak")
    args = parser.parse_args()
    tallies = [Tally(engine) for engine in args.engines]
    for index in range(args.runs):
        for tally in tallies:
            outcome, seconds, tail = run_once(tally.engine, args.epochs)
            tally.runs += 1
            tally.seconds.append(round(seconds, 2))
            tally.passed += outcome == "pass"
            tally.aborts += outcome == "abort"
            tally.other_failures += outcome == "other"
            if outcome != "pass" and not tally.first_failure:
                tally.first_failure = tail
            print(
                f"[{index + 1}/{args.runs}] {tally.engine}: {outcome} ({seconds:.1f}s)", flush=True
            )
        write_report(tallies, Path(args.out), args.runs, args.epochs)
    return 0 if all(t.aborts == 0 and t.other_failures == 0 for t in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
