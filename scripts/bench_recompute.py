"""What activation checkpointing saves on the GPT example: peak memory of one training step
with the activations kept and with every GPT2Block recomputed, measured side by side, beside
what `toolkit plan` predicts for the same model and batch.

    .venv/bin/python scripts/bench_recompute.py --width 256 --layers 8 --micro 32 \
        --out docs/bench/recompute

Each variant runs in a fresh process (one rank, one thread): build the model, then record
torch's own allocations over its first training step with torch.profiler (profile_memory)
and take the high point of what they hold. That holds the gradients (the same in both) and
what backward keeps, so the difference is what recomputation saves.
The recomputation is the toolkit's own (toolkit.backends.torch_recompute), as every torch
engine applies it. Writes recompute.json and a short REPORT.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {"kept": [], "recomputed": ["GPT2Block"]}


def step_peak(width: int, layers: int, micro: int, recomputed: list[str]) -> int:
    """The high point of what torch's allocations hold during the first training step."""
    import torch

    sys.path.insert(0, str(ROOT / "hvd_examples"))
    from gpt_text import build_model, model_config
    from text_common import BLOCK

    from toolkit.backends.torch_recompute import recompute

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(model_config(width, layers))
    recompute(model, recomputed)
    ids = torch.randint(0, 256, (micro, BLOCK))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as profile:
        step()
    # Each event's own allocations less its own frees ([memory] events: frees outside any
    # op), in time order: their running sum is what torch's allocations hold.
    held = peak = 0
    for event in sorted(profile.events(), key=lambda e: e.time_range.start):
        held += event.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


def planned(width: int, layers: int, micro: int) -> dict[str, float]:
    """toolkit plan's activation bytes for a DDP rank of the same model and batch."""
    sys.path.insert(0, str(ROOT / "hvd_examples"))
    from gpt_text import build_model, model_config
    from text_common import BLOCK

    from toolkit.plan import model_facts

    facts = model_facts.walk(build_model(model_config(width, layers)), (BLOCK,), "gpt_text")
    return {
        name: float(facts.kept_per_sample(modules) or 0) * micro * 4
        for name, modules in VARIANTS.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--out", default="reports/bench/recompute")
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(step_peak(args.width, args.layers, args.micro, VARIANTS[args.child]))
        return 0
    shape = ["--width", str(args.width), "--layers", str(args.layers), "--micro", str(args.micro)]
    measured = {
        name: int(
            subprocess.run(
                [sys.executable, __file__, *shape, "--child", name],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()[-1]
        )
        for name in VARIANTS
    }
    plan = planned(args.width, args.layers, args.micro)
    result = {
        "model": {"width": args.width, "layers": args.layers, "micro": args.micro},
        "measured_step_peak_bytes": measured,
        "planned_activation_bytes": plan,
        "measured_saving_bytes": measured["kept"] - measured["recomputed"],
        "planned_saving_bytes": plan["kept"] - plan["recomputed"],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recompute.json").write_text(json.dumps(result, indent=2) + "\n")
    mib = 2**20
    lines = [
        "# Activation checkpointing on the GPT example",
        "",
        f"GPT-2 shape: width {args.width}, {args.layers} blocks, {args.micro} samples of 64 "
        "bytes, one rank. Command: `.venv/bin/python scripts/bench_recompute.py "
        + " ".join(shape)
        + "`.",
        "",
        "| | first step's peak of torch allocations (measured) | activations (toolkit plan) |",
        "|---|---|---|",
        *(
            f"| {name} | {measured[name] / mib:.1f} MiB | {plan[name] / mib:.1f} MiB |"
            for name in VARIANTS
        ),
        f"| saved | {result['measured_saving_bytes'] / mib:.1f} MiB | "
        f"{result['planned_saving_bytes'] / mib:.1f} MiB |",
    ]
    (out / "REPORT.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
