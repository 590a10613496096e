"""The toolkit side of `toolkit bench step` and `toolkit bench compare`: the benchmark's step
through the toolkit's API.

    python toolkit/bench/ranks/toolkit_step.py --spec SPEC.json --out timings.json \
        [--model module:factory] [workload args]

It is the native scripts' loop with the engine code replaced by `toolkit.init`, `run.prepare`,
`run.loader` and `run.train_step`: the same MLP and the same clock (`native/_bench.py`). Only
`train_step` is timed. Rank 0 writes the timings to `--out`; every rank writes its peak
resident memory to `--out` with `.rankN` before the suffix.

`--model module:factory` trains the user's model instead of the MLP: `factory()` returns
`(model, loss_fn, inputs, targets)`, the arrays being the samples the loader cycles through;
`module` is imported with the working directory on the path.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import resource
import sys
from pathlib import Path
from typing import Any

from toolkit.bench.native import _bench
from toolkit.bench.ranks._toolkit_job import start_toolkit, synthetic


def bench_mlp(framework: str, dims: list[int]) -> tuple[Any, Any]:
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


def user_model(target: str) -> tuple[Any, Any, Any]:
    """`module:factory`'s (model, loss_fn, (inputs, targets))."""
    module_name, _, name = target.partition(":")
    sys.path.insert(0, os.getcwd())
    model, loss_fn, inputs, targets = getattr(importlib.import_module(module_name), name)()
    return model, loss_fn, (inputs, targets)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rank_file(out: str, rank: int) -> Path:
    path = Path(out)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def main() -> int:
    parser = _bench.parser(__doc__ or "")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--model", default=None, help="module:factory; default the bench MLP")
    args = _bench.parse(parser)
    spec, run = start_toolkit(args.spec)
    if spec.framework_name == "torch":
        import torch

        torch.manual_seed(args.seed)
    samples = spec.batch_for().global_ * _bench.DISTINCT_BATCHES
    with run.scope():
        if args.model:
            model, loss_fn, data = user_model(args.model)
        else:
            model, loss_fn = bench_mlp(spec.framework_name, _bench.widths(args))
            data = synthetic(_bench.widths(args), samples, args.seed)
    run.prepare(model)
    loader = run.loader(data)
    total = args.warmup + args.steps
    clock = _bench.Clock(args.link)
    loss = float("nan")
    steps = run.steps(loader, epochs=math.ceil(total / len(loader)), desc="bench")
    for index, micro_batches in enumerate(steps):
        step = functools.partial(run.train_step, micro_batches, loss_fn)
        loss = clock.time(step, keep=index >= args.warmup)
        if index + 1 == total:
            break
    _bench.write_record(str(rank_file(args.out, run.rank)), {"peak_rss_bytes": peak_rss_bytes()})
    if run.is_main:
        record = {
            **clock.record(),
            "loss": loss,
            "world": run.world_size,
            "global_batch": spec.batch_for().global_,
        }
        _bench.write_record(args.out, record)
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
