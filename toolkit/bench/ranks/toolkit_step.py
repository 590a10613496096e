"""The toolkit side of `toolkit bench step`: the benchmark's step through the toolkit's API.

    python toolkit/bench/ranks/toolkit_step.py --spec SPEC.json --out timings.json [workload args]

It is the native scripts' loop with the engine code replaced by `toolkit.init`, `run.prepare`,
`run.loader` and `run.train_step`: the same MLP and the same clock (`native/_bench.py`). Only
`train_step` is timed; the loader's time per step is recorded beside it. `--patch NAME` applies
one of `toolkit.bench.patches` first (a candidate fix, measured before anyone changes a backend).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from typing import Any

from toolkit.bench import patches
from toolkit.bench.native import _bench
from toolkit.bench.ranks._toolkit_job import start_toolkit, synthetic


def build_model(framework: str, dims: list[int]) -> tuple[Any, Any]:
    """The MLP and its mean loss function in the spec's framework."""
    if framework == "torch":
        import torch

        from toolkit.bench.native._torch_model import mlp

        return mlp(dims), torch.nn.functional.cross_entropy
    import keras

    from toolkit.bench.native._keras_model import mlp as keras_mlp

    def keras_loss(logits: Any, labels: Any) -> Any:
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    return keras_mlp(dims), keras_loss


def main() -> int:
    parser = _bench.parser(__doc__ or "")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--patch", action="append", default=[], help="patches.PATCHES names")
    args = _bench.parse(parser)
    spec, run = start_toolkit(args.spec)
    for name in args.patch:
        patches.applied(run, name).__enter__()  # for the whole launch
    if spec.framework_name == "torch":
        import torch

        torch.manual_seed(args.seed)
    with run.scope():
        model, loss_fn = build_model(spec.framework_name, _bench.widths(args))
    run.prepare(model)
    samples = spec.batch_for().global_ * _bench.DISTINCT_BATCHES
    loader = run.loader(synthetic(_bench.widths(args), samples, args.seed))
    total = args.warmup + args.steps
    clock = _bench.Clock()
    loader_s: list[float] = []
    loss = float("nan")
    steps = run.steps(loader, epochs=math.ceil(total / len(loader)), desc="bench")
    fetched = time.perf_counter()
    for index, micro_batches in enumerate(steps):
        timed = index >= args.warmup
        if timed:
            loader_s.append(time.perf_counter() - fetched)
        step = functools.partial(run.train_step, micro_batches, loss_fn)
        loss = clock.time(step, keep=timed)
        if index + 1 == total:
            break
        fetched = time.perf_counter()
    if run.is_main:
        record = {
            "step_s": clock.wall,
            "cpu_s": clock.cpu,
            "faults": clock.faults,
            "loader_s": loader_s,
            "loss": loss,
            "world": run.world_size,
            "settings": {"threads": int(os.environ["OMP_NUM_THREADS"]), "patches": args.patch},
        }
        _bench.write_record(args.out, record)
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
