"""Soak: run each engine's 2-rank example job many times and count aborts at exit.

Not a CI test (50 runs per engine take about two hours on 2 cores): it is the evidence that a
rare crash at interpreter exit ("terminate called without an active exception", SIGABRT) is
gone. Each run is the README's example under `toolkit launch` with the real launcher the spec
names, on ports chosen free for that run (so jobs running beside the soak cannot fail it). A
run counts as an abort when any process died of SIGABRT or printed "terminate called".

Runs accumulate in OUT/soak.json (each with its commit and time), so a soak can be continued
across sittings: `--until 50` runs each engine until it has 50 runs on record. OUT/SOAK.md is
rewritten after every round: per engine, runs, passes, aborts and other failures, with the tail
of the first failure of each kind.

    .venv/bin/python scripts/soak.py --until 50 --out docs/soak
    .venv/bin/python scripts/soak.py --until 5 --engines zero1 ddp --out /tmp/soak   # a look

With --chaos it is the chaos soak instead (scripts/chaos.py): jobs with restarts, hit by
faults, against the weights of the run that lost nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from toolkit.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SPECS = ROOT / "hvd_examples" / "specs"
ABORT_MARKERS = ("terminate called", "Aborted", "SIGABRT", "signal 6")
ABORT_STATUSES = (-6, 134, 250)
RUN_TIMEOUT_S = 600

# variant -> (spec file, example script); the spec names the launcher.
VARIANTS: dict[str, tuple[str, str]] = {
    "ddp": ("ddp.yaml", "torch_digits.py"),
    "horovod": ("horovod.yaml", "torch_digits.py"),
    "horovod-mpi": ("horovod_mpi.yaml", "torch_digits.py"),
    "zero1": ("zero1.yaml", "torch_digits.py"),
    "zero2": ("zero2.yaml", "torch_digits.py"),
    "zero3": ("zero3.yaml", "torch_digits.py"),
    "pipeline": ("pipeline.yaml", "torch_digits.py"),
    "horovod-tf": ("horovod_tf.yaml", "tf_digits.py"),
    "tf-multiworker": ("tf_multiworker.yaml", "tf_digits.py"),
}
# engine -> the variants its runs rotate through: DeepSpeed's cover its ZeRO stages and the
# pipeline engine; name one variant (e.g. `--engines zero1`) to soak it alone.
JOBS: dict[str, tuple[str, ...]] = {
    **{variant: (variant,) for variant in VARIANTS},
    "horovod": ("horovod", "horovod-mpi"),
    "deepspeed": ("zero1", "zero2", "zero3", "pipeline"),
}
DEFAULT_ENGINES = ["ddp", "horovod", "deepspeed", "horovod-tf", "tf-multiworker"]


def spec_on_free_ports(spec_file: str, directory: Path) -> Path:
    spec: dict[str, Any] = yaml.safe_load((SPECS / spec_file).read_text())
    spec["launch"]["master_port"] = free_port()
    if "tf" in spec:
        spec["tf"]["port"] = free_port()
    path = directory / spec_file
    path.write_text(yaml.safe_dump(spec))
    return path


def run_once(variant: str, epochs: int) -> dict[str, Any]:
    spec_file, script = VARIANTS[variant]
    with tempfile.TemporaryDirectory(prefix="soak-") as directory:
        spec = str(spec_on_free_ports(spec_file, Path(directory)))
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
            return {"outcome": "other", "seconds": RUN_TIMEOUT_S, "tail": "timed out"}
    output = done.stdout + done.stderr
    aborted = any(m in output for m in ABORT_MARKERS) or done.returncode in ABORT_STATUSES
    outcome = "abort" if aborted else "pass" if done.returncode == 0 else "other"
    tail = "" if outcome == "pass" else "\n".join(output.splitlines()[-15:])
    return {"outcome": outcome, "seconds": round(time.monotonic() - start, 2), "tail": tail}


def current_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def summary_rows(records: list[dict[str, Any]], engines: list[str]) -> list[str]:
    rows = [
        "| engine | runs (by variant) | passed | aborts | other failures | median s |",
        "|---|---|---|---|---|---|",
    ]
    for name in engines:
        mine = [r for r in records if r["engine"] == name]
        counts = {v: sum(r["variant"] == v for r in mine) for v in JOBS[name]}
        by_variant = ", ".join(f"{variant} {count}" for variant, count in counts.items())
        seconds = sorted(r["seconds"] for r in mine)
        median = seconds[len(seconds) // 2] if seconds else float("nan")
        tally = {o: sum(r["outcome"] == o for r in mine) for o in ("pass", "abort", "other")}
        rows.append(
            f"| {name} | {len(mine)} ({by_variant}) | {tally['pass']} | {tally['abort']} | "
            f"{tally['other']} | {median:.1f} |"
        )
    return rows


def write_report(records: list[dict[str, Any]], out: Path, engines: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps({"runs": records}, indent=1) + "\n")
    commits = sorted({r["commit"] for r in records})
    lines = [
        "# Soak: aborts at exit",
        "",
        "Each engine's 2-rank example (1 epoch of digits) under `toolkit launch` and the",
        "launcher its spec names, run again and again; written by `scripts/soak.py`.",
        f"Commits: {', '.join(commits)}. Every run: soak.json.",
        "",
        *summary_rows(records, engines),
    ]
    for record in records:
        if record["outcome"] != "pass" and record["tail"]:
            lines += ["", f"{record['outcome']}: {record['variant']} at {record['time']}:"]
            lines += ["", "```", record["tail"], "```"]
    (out / "SOAK.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    if "--chaos" in sys.argv[1:]:
        import chaos  # beside this script

        return chaos.main(chaos.parse_args(sys.argv[1:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--until", type=int, default=50, help="runs per engine on record")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--engines", nargs="*", default=DEFAULT_ENGINES, choices=list(JOBS))
    parser.add_argument("--out", default="reports/soak")
    args = parser.parse_args()
    out = Path(args.out)
    saved = out / "soak.json"
    records: list[dict[str, Any]] = json.loads(saved.read_text())["runs"] if saved.exists() else []
    commit = current_commit()
    while True:
        behind = [e for e in args.engines if sum(r["engine"] == e for r in records) < args.until]
        if not behind:
            break
        for name in behind:
            done = sum(r["engine"] == name for r in records)
            variant = JOBS[name][done % len(JOBS[name])]
            result = run_once(variant, args.epochs)
            records.append(
                {"engine": name, "variant": variant, "commit": commit,
                 "time": time.strftime("%Y-%m-%d %H:%M:%S"), **result}
            )  # fmt: skip
            print(f"[{done + 1}/{args.until}] {variant}: {result['outcome']} "
                  f"({result['seconds']:.1f}s)", flush=True)  # fmt: skip
        write_report(records, out, args.engines)
    failed = any(r["outcome"] != "pass" for r in records if r["engine"] in args.engines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
