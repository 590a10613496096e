"""Probe: what `launch.malloc: keep` (toolkit/render/malloc.py) changes in a torch CPU step.

GLIBC_TUNABLES is read when a process starts, so the two settings cannot alternate inside one
process: each launch is one child process that trains an MLP alone (one thread, SGD with
momentum, as the benches do), and launches alternate glibc's own settings and the toolkit's,
pair by pair. Per model it prints one JSON line: per setting the median step in ms, the step-to-
step spread (the 5th to 95th percentile, in ms) and the page faults per step, each the median
over launches; and the second setting over the first (keep / glibc by default), the ratio of
the two medians of each pair, median and range.

    .venv/bin/python scripts/malloc_probe.py [--pairs 4] [--steps 100] [--models 0 2] [--keep-grads]
        [--settings keep keep+huge]

--settings names the two settings to alternate (SETTINGS; glibc's own and the toolkit's by
default); the ratio is the second over the first. `keep+huge` adds glibc's `hugetlb=1`, under
which malloc asks the kernel for transparent huge pages (madvise) for the memory it takes.

--keep-grads zeroes the gradients in place instead of freeing them, as a DDP step does (its
gradients are views into its buckets): how much of the faulting is the freed gradients.

The models: the step bench's MLP (docs/bench/spec.yaml, 64 samples), the pipeline bubble
bench's (toolkit/bench/bubble.py, 128 samples), and a GPT-2-shaped transformer trained with AdamW
(the GPT example's model, hvd_examples/gpt_text.py, at 6 layers of 384 instead of 2 of 64, built
by its build_model), and an MLP with one weight of 64 MiB, above any mmap threshold glibc
allows (what `mmap_max=0` in the toolkit's settings is for).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "step bench MLP 512-2048-2048-512-10, 64 samples": {"mlp": [512, 2048, 2048, 512, 10], "n": 64},
    "bubble bench MLP 1536-1024x8, 128 samples": {"mlp": [1536] + [1024] * 8, "n": 128},
    "GPT-2 shape (6 layers of 384, 6 heads), 8 x 64 tokens, AdamW": {"gpt": [6, 384], "n": 8},
    "MLP 1024-4096-4096-10 (a 64 MiB weight), 64 samples": {"mlp": [1024, 4096, 4096, 10], "n": 64},
}


def settings() -> dict[str, str]:
    """GLIBC_TUNABLES by setting name ("" is glibc's own settings)."""
    from toolkit.render.malloc import KEEP_FREED_MEMORY

    return {
        "glibc": "",
        "keep": KEEP_FREED_MEMORY,
        "keep+huge": f"{KEEP_FREED_MEMORY}:glibc.malloc.hugetlb=1",
    }


def build(model: dict):  # type: ignore[no-untyped-def]
    """(module, optimizer, a function of the module giving the loss)."""
    import torch

    if "gpt" in model:
        sys.path.insert(0, str(ROOT / "hvd_examples"))
        from gpt_text import build_model, model_config
        from text_common import BLOCK, VOCAB

        layers, width = model["gpt"]
        config = model_config()
        config.update({"n_layer": layers, "n_embd": width, "n_head": 6})
        module = build_model(config)
        ids = torch.randint(0, VOCAB, (model["n"], BLOCK))
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
        return module, optimizer, lambda m: m(input_ids=ids, labels=ids).loss
    from toolkit.bench.native._torch_model import mlp

    dims = model["mlp"]
    module = mlp(dims)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(model["n"], dims[0])
    y = torch.randint(0, dims[-1], (model["n"],))
    return module, optimizer, lambda m: torch.nn.functional.cross_entropy(m(x), y)


def child(model: dict, warmup: int, steps: int, keep_grads: bool) -> dict[str, float]:
    import torch

    from toolkit.bench.native._bench import minor_faults

    torch.set_num_threads(1)
    module, optimizer, loss_of = build(model)
    times = []
    for step in range(warmup + steps):
        if step == warmup:
            faults_before = minor_faults()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=not keep_grads)
        loss_of(module).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    faults = minor_faults() - faults_before
    timed = times[warmup:]
    cuts = statistics.quantiles(timed, n=20)
    return {
        "median_ms": statistics.median(timed) * 1e3,
        "spread_ms": (cuts[-1] - cuts[0]) * 1e3,
        "faults_per_step": faults / steps,
    }


def launch(model: dict, args: argparse.Namespace, setting: str) -> dict:
    env = {name: value for name, value in os.environ.items() if name != "GLIBC_TUNABLES"}
    if tunables := settings()[setting]:
        env["GLIBC_TUNABLES"] = tunables
    argv = [sys.executable, __file__, "--child", json.dumps(model)]
    argv += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    argv += ["--keep-grads"] if args.keep_grads else []
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument(
        "--keep-grads",
        action="store_true",
        help="zero the gradients in place (zero_grad(set_to_none=False)), as DDP's bucket views "
        "keep them, instead of freeing them every step",
    )
    parser.add_argument(
        "--settings",
        nargs=2,
        choices=sorted(settings()),
        default=["glibc", "keep"],
        help="the two settings to alternate; the ratio is the second's step over the first's",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="*", type=int, help="indexes into MODELS (default all)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child), args.warmup, args.steps, args.keep_grads)))
        return
    for index, (name, model) in enumerate(MODELS.items()):
        if args.models and index not in args.models:
            continue
        first, second = args.settings
        runs: dict[str, list[dict]] = {first: [], second: []}
        for pair in range(args.pairs):
            order = (first, second) if pair % 2 == 0 else (second, first)
            for setting in order:
                runs[setting].append(launch(model, args, setting))
        ratios = [
            b["median_ms"] / a["median_ms"]
            for b, a in zip(runs[second], runs[first], strict=True)
        ]
        summary = {
            setting: {
                key: round(statistics.median(run[key] for run in launches), 2)
                for key in ("median_ms", "spread_ms", "faults_per_step")
            }
            for setting, launches in runs.items()
        }
        print(
            json.dumps(
                {
                    "model": name,
                    "pairs": args.pairs,
                    "keep_grads": args.keep_grads,
                    **summary,
                    f"{second}_over_{first}": {
                        "median": round(statistics.median(ratios), 3),
                        "min": round(min(ratios), 3),
                        "max": round(max(ratios), 3),
                    },
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
