"""Train a tiny MLP for --steps optimizer steps, saving and resuming through checkpoint.dir.

    torchrun --nproc_per_node 2 resume_torch.py --spec S --steps 7 --out W.npz
    torchrun --nproc_per_node 2 resume_torch.py --spec S --steps 7 --stop-at 5   # interrupted
    torchrun --nproc_per_node 2 resume_torch.py --spec S --steps 7 --out W.npz   # resumes

With checkpoint.dir and every_steps in the spec, the run saves periodically and a new launch
resumes from the latest checkpoint by itself. --stop-at ends the run after that step, as a
job that is stopped would; --kill-at and --kill-once crash rank 1 once (crash_once.py);
--step-seconds slows every step down (a preemption test's signal then comes mid-run).
--hidden widens the model (the kill tests make saves slow with it).
Rank 0 writes the final full weights to --out (.npz) and every rank prints one JSON line
(rank, step, the step it resumed from).
"""

from __future__ import annotations

import argparse
import sys
import time

import crash_once  # beside this script
import numpy as np
import torch

import toolkit
from toolkit.launch.environment import split_local_rank_arg
from toolkit.report import print_json

SAMPLES, FEATURES, CLASSES = 256, 8, 4


def build_model(hidden: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, CLASSES)
    )


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    return x, (x[:, :CLASSES].argmax(axis=1)).astype(np.int64)


def main() -> int:
    argv, _ = split_local_rank_arg(sys.argv[1:])
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--out")
    crash_once.add_arguments(parser)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step")
    parser.add_argument("--hidden", type=int, default=16, help="width (large: slow saves)")
    args = parser.parse_args(argv)
    spec = toolkit.load_spec(args.spec)
    run = toolkit.init(spec)
    torch.manual_seed(spec.seed)
    run.prepare(build_model(args.hidden))
    resumed_from = run.step
    for micro_batches in run.steps(run.loader(data()), epochs=1000):
        if run.step >= args.steps:
            break
        run.train_step(micro_batches, torch.nn.functional.cross_entropy)
        crash_once.maybe_crash(args, run.rank, run.step)
        time.sleep(args.step_seconds)
        if run.step == args.stop_at:
            break
    weights = run.full_state_dict()
    if args.out and run.is_main:
        np.savez(args.out, **weights)
    print_json(rank=run.rank, step=run.step, resumed_from=resumed_from)
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
