"""The rank program of `toolkit bench step --in-process`: the engine's own step and the
toolkit's `train_step`, alternating step by step in the same processes on the same engine.

    python toolkit/bench/ranks/inprocess_step.py --spec S.json --out t.json [workload args]

After `toolkit.init` and `run.prepare`, the variants' steps interleave in an order in which
every variant follows every other one equally often (toolkit.bench.ordering: a step inherits
its predecessor's state, the ranks' skew among it): `native` (ranks/native_steps.py: the
engine's documented step on the objects the toolkit built), `toolkit` (`run.train_step`),
`native-again` (A/A), one `toolkit+PATCH` per `--patch` (train_step inside that candidate
fix, toolkit.bench.patches; "a+b" combines patches) and, with `--floor`, `floor`: the physical
floor's step (native/_floor_parts.py), a plain model of the framework's own on this rank's
batch with no engine, then its gradient bytes copied once. Steps of different variants are
then milliseconds apart, so another job's burst reaches them alike, which launch-to-launch
comparison cannot offer on a shared machine. What this cannot see is how the engine was set up
(its config, threads, launcher): the launch-level comparison measures that.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from toolkit.bench.native import _bench
from toolkit.bench.native._floor_parts import COMPUTE, FloorStep
from toolkit.bench.ordering import carryover_balanced
from toolkit.bench.patches import applied
from toolkit.bench.ranks._toolkit_job import start_toolkit, synthetic
from toolkit.bench.ranks.native_steps import BUILDERS, only_batch_tensors
from toolkit.bench.ranks.toolkit_step import build_model


def patched_step(run: Any, loss_fn: Any, names: str) -> Callable[[Any], Any]:
    """train_step inside the patches `names`, with a loss function object of its own (a TF
    engine compiles one step per loss function: this variant's is traced patched)."""

    def own_loss(outputs: Any, targets: Any) -> Any:
        return loss_fn(outputs, targets)

    def step(micro_batches: Any) -> Any:
        with applied(run, names):
            return run.train_step(micro_batches, own_loss)

    return step


def floor_variant(framework: str, args: Any, steps: list[list[Any]]) -> tuple[FloorStep, list[Any]]:
    """The floor's step and its inputs: each loader step's one micro-batch as the framework's
    tensors. Its model is built outside the toolkit's scope (a TF strategy's included), so no
    engine sees it."""
    if any(len(micro_batches) != 1 for micro_batches in steps):
        raise SystemExit("--floor: the in-process floor takes one micro-batch per step")
    step = FloorStep(*COMPUTE[framework](_bench.widths(args), args.lr, args.momentum))
    return step, [only_batch_tensors(framework, micro_batches) for micro_batches in steps]


def main() -> int:
    parser = _bench.parser(__doc__ or "")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--patch", action="append", default=[], help="patches.PATCHES names")
    parser.add_argument("--floor", action="store_true", help="add the physical floor's step")
    args = _bench.parse(parser)
    spec, run = start_toolkit(args.spec)
    framework = spec.framework_name
    if framework == "torch":
        import torch

        torch.manual_seed(args.seed)
    with run.scope():
        model, loss_fn = build_model(framework, _bench.widths(args))
    run.prepare(model)
    samples = spec.batch_for().global_ * _bench.DISTINCT_BATCHES
    steps = list(run.loader(synthetic(_bench.widths(args), samples, args.seed)))
    native, convert = BUILDERS[(spec.backend, framework)](run, loss_fn, args.lr, args.momentum)
    native_inputs = [convert(micro_batches) for micro_batches in steps]

    variants: dict[str, tuple[Callable[[Any], Any], list[Any]]] = {
        "native": (native, native_inputs),
        "toolkit": (functools.partial(run.train_step, loss_fn=loss_fn), steps),
        "native-again": (native, native_inputs),
    }
    for names in args.patch:
        variants[f"toolkit+{names}"] = (patched_step(run, loss_fn, names), steps)
    floor = floor_variant(framework, args, steps) if args.floor else None
    if floor is not None:
        variants["floor"] = floor
    clocks = {name: _bench.Clock() for name in variants}
    names = list(variants)
    order = [names[index] for index in carryover_balanced(len(names))]
    # Whole rounds of the order, each variant's n-th step on the n-th batch, until every
    # variant has its warm-up and timed steps (a round gives each len(names) - 1).
    rounds = -(-(args.warmup + args.steps) // max(len(names) - 1, 1))
    done = dict.fromkeys(names, 0)
    for name in order * rounds:
        step, inputs = variants[name]
        batch = inputs[done[name] % len(inputs)]
        clocks[name].time(functools.partial(step, batch), keep=done[name] >= args.warmup)
        done[name] += 1
    if run.is_main:
        record = {
            "step_s": {name: clock.wall for name, clock in clocks.items()},
            "cpu_s": {name: clock.cpu for name, clock in clocks.items()},
            "faults": {name: clock.faults for name, clock in clocks.items()},
            "world": run.world_size,
        }
        if floor is not None:
            record["compute_s"] = floor[0].compute_seconds[args.warmup :]
            record["move_s"] = floor[0].move.seconds[args.warmup :]
        _bench.write_record(args.out, record)
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
