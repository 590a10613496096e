"""The rank program of `toolkit bench memory`: what a real run through the toolkit holds.

    python toolkit/bench/ranks/memory_probe.py --spec S.json --layers 512,4096,10 --out m.json

Resident set size (psutil) after `toolkit.init` (the baseline: interpreter, engine, process
group), after `run.prepare`, and after the steps (all after a gc.collect()), with the peak during
the steps sampled every 2 ms by a thread; and a census of the torch tensors alive after the steps,
each storage counted once: all of them, and those held as optimizer state by any
torch.optim.Optimizer (the engines' optimizers all end in one). The census counts allocated
bytes; RSS counts only the pages touched (DeepSpeed's bucket of reduce_bucket_size elements is
allocated whole and touched only as far as the gradients reach).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import torch

from toolkit.bench.native._torch_model import mlp
from toolkit.bench.ranks._toolkit_job import start_toolkit, synthetic


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--layers", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    args, _ = parser.parse_known_args(argv)
    return args


class PeakSampler:
    """The highest RSS seen while it runs."""

    def __init__(self, interval: float = 0.002) -> None:
        self.process = psutil.Process()
        self.interval = interval
        self.peak = self.process.memory_info().rss
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakSampler:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join()


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def _storage(tensor: torch.Tensor) -> tuple[int, int] | None:
    if tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    return (storage.data_ptr(), storage.nbytes()) if storage.nbytes() else None


def census() -> dict[str, int]:
    """Bytes of every live torch tensor and of optimizer state, each storage once."""
    gc.collect()
    everything: dict[int, int] = {}
    states: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            found = _storage(obj)
            if found:
                everything[found[0]] = found[1]
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for value in state.values():
                    found = _storage(value) if isinstance(value, torch.Tensor) else None
                    if found:
                        states[found[0]] = found[1]
    return {"tensors": sum(everything.values()), "optimizer_state": sum(states.values())}


def main() -> int:
    args = parse(sys.argv[1:])
    spec, run = start_toolkit(args.spec)
    widths = [int(w) for w in args.layers.split(",")]
    loader = run.loader(synthetic(widths, spec.batch_for(run.world_size).global_ * 2))
    baseline = rss()
    torch.manual_seed(0)
    run.prepare(mlp(widths))
    prepared = rss()
    with PeakSampler() as sampler:
        done = 0
        while done < args.steps:
            for micro_batches in loader:
                run.train_step(micro_batches, torch.nn.functional.cross_entropy)
                done += 1
                if done == args.steps:
                    break
    after = rss()
    counted = census()
    record = {
        "rank": run.rank,
        "rss_baseline": baseline,
        "rss_prepared": prepared,
        "rss_after_steps": after,
        "rss_peak": max(sampler.peak, after),
        **counted,
    }
    records: list[Any] = [record]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        records = [None] * run.world_size  # every rank's, where torch.distributed runs
        torch.distributed.all_gather_object(records, record)
    if run.is_main:
        Path(args.out).write_text(json.dumps(records))
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
