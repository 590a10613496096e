"""What a checkpoint save costs the training loop: synchronous against background saves
(`checkpoint.async`), on the GPT example.

Each run is the GPT example (hvd_examples/gpt_text.py) under `toolkit launch` with the spec
gpt_ddp.yaml names, for --steps steps, saving every --every steps into a fresh directory: no
saves, synchronous saves, background saves. The runs alternate (none, sync, async, none, ...)
so the machine's noise falls on all three alike. The loop's time is the example's own
`train_seconds` (the training loop alone, no start-up); a save's cost to the loop is (loop
time with saves - loop time without) / saves, from the medians.

    .venv/bin/python scripts/bench_saves.py --width 512 --layers 8 --out docs/bench/saves
    .venv/bin/python scripts/bench_saves.py --steps 12 --every 3 --reps 1 --out /tmp/saves

Writes OUT/saves.json (every run, with the machine) and OUT/SAVES.md (the table).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from toolkit.bench import report
from toolkit.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SPEC = ROOT / "hvd_examples" / "specs" / "gpt_ddp.yaml"
SCRIPT = ROOT / "hvd_examples" / "gpt_text.py"
MODES = ("none", "sync", "async")
RUN_TIMEOUT_S = 1200
TRAIN_SECONDS = re.compile(r'"train_seconds": ([0-9.]+)')


def spec_for(mode: str, workdir: Path, every: int) -> Path:
    spec: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    spec["launch"] = {**spec.get("launch", {}), "master_port": free_port()}
    if mode != "none":
        spec["checkpoint"] = {
            "dir": str(workdir / "checkpoints"),
            "every_steps": every,
            "keep": 2,
            "resume": "never",
            "async": mode == "async",
        }
    path = workdir / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def checkpoint_bytes(directory: Path) -> int:
    """Bytes of the newest checkpoint under `directory` (0 when none)."""
    steps = sorted(directory.glob("step-*"))
    return sum(f.stat().st_size for f in steps[-1].rglob("*") if f.is_file()) if steps else 0


def one_run(mode: str, args: argparse.Namespace) -> tuple[float, int]:
    """(the training loop's seconds, bytes of one checkpoint) of one run of the GPT example."""
    with tempfile.TemporaryDirectory(prefix=f"bench-saves-{mode}-") as where:
        spec = spec_for(mode, Path(where), args.every)
        argv = [str(BIN / "toolkit"), "launch", "--spec", str(spec), "--", str(SCRIPT)]
        argv += ["--spec", str(spec), "--steps", str(args.steps), "--eval-every", str(args.steps)]
        argv += ["--width", str(args.width), "--layers", str(args.layers)]
        done = subprocess.run(
            argv,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        saved = checkpoint_bytes(Path(where) / "checkpoints")
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    found = TRAIN_SECONDS.findall(done.stdout)
    if not found:
        raise SystemExit(f"{mode} run printed no train_seconds:\n{done.stdout[-3000:]}")
    return float(found[-1]), saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--width", type=int, default=64, help="the example's --width")
    parser.add_argument("--layers", type=int, default=2, help="the example's --layers")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    saves = args.steps // args.every
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    checkpoint = 0
    for rep in range(args.reps):
        for mode in MODES:
            loop, saved = one_run(mode, args)
            seconds[mode].append(loop)
            checkpoint = max(checkpoint, saved)
            print(f"rep {rep + 1} {mode}: {seconds[mode][-1]:.1f} s", file=sys.stderr)
    median = {mode: statistics.median(values) for mode, values in seconds.items()}
    cost = {mode: (median[mode] - median["none"]) / saves for mode in ("sync", "async")}
    figures = {
        "example": f"hvd_examples/gpt_text.py --width {args.width} --layers {args.layers}, "
        "gpt_ddp.yaml (DDP, 2 ranks, torchrun)",
        "checkpoint_mb": checkpoint / 1e6,
        "steps": args.steps,
        "every_steps": args.every,
        "saves": saves,
        "loop_seconds": seconds,
        "median_loop_seconds": median,
        "loop_seconds_per_save": cost,
        "async_over_sync": cost["async"] / cost["sync"] if cost["sync"] > 0 else None,
    }
    rows = [
        [
            mode,
            f"{median[mode]:.1f}",
            " ".join(f"{value:.1f}" for value in seconds[mode]),
            "-" if mode == "none" else report.milliseconds(1000 * cost[mode]),
        ]
        for mode in MODES
    ]
    header = ["saves", "loop s (median)", "loop s (each run)", "loop ms per save"]
    command = ["scripts/bench_saves.py", *sys.argv[1:]]
    record = {"command": command, "machine": report.machine(), **figures}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "saves.json").write_text(json.dumps(record, indent=1) + "\n")
    caption = (
        f"`{' '.join(command)}` on {record['machine']['cores']} cores, "
        f"{record['machine']['date']}: {figures['example']}, {args.steps} steps, a save of "
        f"{checkpoint / 1e6:.0f} MB every {args.every}.\n\n"
    )
    (args.out / "SAVES.md").write_text(caption + report.markdown_table(header, rows))
    print(report.text_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
