"""The rank program of `toolkit bench memory`: what a real run through the toolkit holds.

    python toolkit/bench/ranks/memory_probe.py --spec S.json --layers 512,4096,10 --out m.json

Resident memory is the process's anonymous and shared-memory pages (RssAnon + RssShmem of
/proc/self/status), read after a gc.collect() and glibc's malloc_trim(0): after `toolkit.init`
(the baseline: interpreter, engine, process group), after `run.prepare`, at the step's high
points (`StepReadings`: as each gradient collective and each optimizer step begins), and after
the steps; with the peak during the steps sampled every 2 ms by a thread (no trim there). The
step's reading is the moment `toolkit plan` describes: parameters, gradients, optimizer state
and engine buffers all alive (the activations are freed by then). After the steps, some
engines have freed their gradients (DeepSpeed's ZeRO-0 to 2). Left out of every reading, and
why:

- file-backed pages (RssFile): library code paged in as new kernels first run, 10-20 MiB a
  rank here, shared by every process that maps the library and dropped by the kernel at will;
  recorded apart as `file_backed_growth`;
- what the allocator keeps after a free: without the trim, RSS after the steps moved by tens
  of MiB from run to run. The trim returns only the main arena's free top, not the top of the
  arenas glibc gives other threads, so the probe sends every thread's allocations to the main
  arena (`one_malloc_arena`). Gloo's worker threads allocate a collective's temporaries, such as
  the flat output of an all-gather, which ZeRO-3 runs layer by layer: their arenas kept 24 MiB
  a rank resident after the frees on the second model of docs/bench/findings.md (ZeRO-3 read
  1.092 of the plan with them, 1.007 without);
- the engines' lazy imports: the first `optimizer.step()` of a process imports torch._dynamo
  (836 modules, sympy among them), 67 MiB of anonymous memory a rank on torch 2.13, whichever
  engine runs it; `deepspeed.initialize` imports 615 more (torch._inductor's code generators,
  networkx), 50 MiB. Code is not the job's data, and no plan counts it, so the bench runs each
  case twice: the first run writes the modules it loaded (`--modules-out`), the second imports
  them before its baseline (`--preload`) and is the one measured.

And a census of the torch tensors alive after the steps, each storage counted once: all of
them, and those held as optimizer state by any torch.optim.Optimizer (the engines' optimizers
all end in one). The census counts allocated bytes; resident memory counts only the pages
touched (DeepSpeed's bucket of reduce_bucket_size elements is allocated whole and touched only
as far as the gradients reach).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import json
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from toolkit.bench.native._torch_model import mlp
from toolkit.bench.ranks._toolkit_job import start_toolkit, synthetic
from toolkit.units import MIB


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--layers", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", help="rank 0 writes every rank's readings here")
    parser.add_argument("--modules-out", help="rank 0 writes the modules loaded by the end here")
    parser.add_argument("--preload", help="import the modules listed here before the baseline")
    args, _ = parser.parse_known_args(argv)
    return args


def preload(listing: str) -> list[str]:
    """Import, in their order, the modules an earlier run of the same case loaded; the names of
    those that would not import here (they are left out of the baseline, so counted)."""
    failed = []
    for name in json.loads(Path(listing).read_text()):
        if name in sys.modules or name.startswith("__"):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # some import only where their parent chose to load them
            failed.append(name)
    return failed


def status_kib() -> dict[str, int]:
    """The resident-memory lines of /proc/self/status, in KiB."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                name, kib, _ = line.split()
                found[name.rstrip(":")] = int(kib)
    return found


def resident(kib: dict[str, int]) -> int:
    """The bytes the bench counts in a `status_kib()` reading: anonymous plus shared memory."""
    return (kib["RssAnon"] + kib["RssShmem"]) * 1024


def resident_now() -> int:
    """Resident bytes as they are, allocator caches and all (the peak sampler's view)."""
    return resident(status_kib())


class PeakSampler:
    """The highest resident memory seen while it runs."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = resident_now()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, resident_now())

    def __enter__(self) -> PeakSampler:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join()


_LIBC = ctypes.CDLL("libc.so.6")
M_ARENA_MAX = -8
"""mallopt's parameter for the number of malloc arenas (glibc's malloc.h)."""


def one_malloc_arena() -> None:
    """Every thread started from now on allocates from the main arena, the one arena whose
    free top malloc_trim hands back (a non-main arena's free top stays resident)."""
    if _LIBC.mallopt(M_ARENA_MAX, 1) != 1:
        raise OSError("mallopt(M_ARENA_MAX, 1) failed")


def settled() -> tuple[int, int]:
    """Resident anonymous + shared-memory bytes once garbage is collected and glibc has handed
    its free pages back, and the file-backed bytes beside them."""
    gc.collect()
    _LIBC.malloc_trim(0)
    kib = status_kib()
    return resident(kib), kib["RssFile"] * 1024


COLLECTIVES: dict[str, tuple[str, ...]] = {
    "torch.distributed": (
        "all_reduce",
        "reduce_scatter_tensor",
        "all_gather_into_tensor",
        "reduce",
    ),
    "deepspeed.comm": (
        "reduce_scatter_fn",
        "allgather_fn",
        "all_reduce",
        "reduce",
        "all_gather_into_tensor",
    ),
}
"""Module -> the collectives `StepReadings` reads memory before; each takes the tensor first
(DeepSpeed's gathers and reduce-scatter, the output)."""


class StepReadings:
    """The settled resident memory at a step's high points, the highest kept: as every
    optimizer step begins (a global torch.optim pre-hook; the engines' optimizers all end in a
    torch one) and as every collective of 1 MiB or more begins, where an engine's transient
    buffers live (ZeRO-0's flattened gradients, the full gradients ZeRO-1/2 reduce into their
    partition and then free, the gradients of the layer ZeRO-3 has gathered). The collectives
    are torch.distributed's, DeepSpeed's `reduce_scatter_fn` and `allgather_fn`, through
    which ZeRO-3 goes (its `all_gather_function` was bound to torch's when DeepSpeed started,
    out of reach of a wrapper on torch.distributed), and DeepSpeed's `all_reduce`, `reduce`
    (ZeRO-1/2's reduction of each partition to its owner) and `all_gather_into_tensor`, which
    ZeRO-0/1/2 call. On one host all of DeepSpeed's reach shared memory, not
    torch.distributed (toolkit.backends.deepspeed.shared_memory_comm). Horovod's and DDP's
    shared-memory reductions are none of these; their buffers persist, so the step's reading
    sees them."""

    def __init__(self) -> None:
        self.highest = 0
        self.where = ""
        """What was about to run at the highest reading (a collective and its MiB, or the
        optimizer step), and in which step."""
        self.steps_begun = 0
        self.originals = [
            (sys.modules[module], name, getattr(sys.modules[module], name))
            for module, names in COLLECTIVES.items()
            if module in sys.modules
            for name in names
        ]
        self.handle = register_optimizer_step_pre_hook(self._optimizer_step)

    def _read(self, label: str) -> None:
        reading = settled()[0]
        if reading > self.highest:
            self.highest, self.where = reading, f"step {self.steps_begun + 1}: {label}"

    def _optimizer_step(self, *_: Any) -> None:
        self._read("optimizer step")
        self.steps_begun += 1

    def _reading_first(self, name: str, original: Any) -> Any:
        def collective(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            size = tensor.numel() * tensor.element_size()
            if size >= MIB:
                self._read(f"{name} of {size / MIB:.1f} MiB")
            return original(tensor, *args, **kwargs)

        return collective

    def __enter__(self) -> StepReadings:
        for module, name, original in self.originals:
            setattr(module, name, self._reading_first(name, original))
        return self

    def __exit__(self, *_: Any) -> None:
        self.handle.remove()
        for module, name, original in self.originals:
            setattr(module, name, original)


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
    one_malloc_arena()  # before the engines start their threads
    spec, run = start_toolkit(args.spec)
    widths = [int(w) for w in args.layers.split(",")]
    loader = run.loader(synthetic(widths, spec.batch_for(run.world_size).global_ * 2))
    not_preloaded = preload(args.preload) if args.preload else []
    baseline, file_baseline = settled()
    torch.manual_seed(0)
    run.prepare(mlp(widths))
    prepared, _ = settled()
    with PeakSampler() as sampler, StepReadings() as at_step:
        done = 0
        while done < args.steps:
            for micro_batches in loader:
                run.train_step(micro_batches, torch.nn.functional.cross_entropy)
                done += 1
                if done == args.steps:
                    break
    after, file_after = settled()
    counted = census()
    record = {
        "rank": run.rank,
        "resident_baseline": baseline,
        "resident_prepared": prepared,
        "resident_at_step": at_step.highest,
        "at_step_where": at_step.where,
        "resident_after_steps": after,
        "resident_peak": max(sampler.peak, after),
        "file_backed_growth": file_after - file_baseline,
        "not_preloaded": not_preloaded,
        **counted,
    }
    if args.out:
        records: list[Any] = [record]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            records = [None] * run.world_size  # every rank's, where torch.distributed runs
            torch.distributed.all_gather_object(records, record)
        if run.is_main:
            Path(args.out).write_text(json.dumps(records))
    if run.is_main and args.modules_out:
        Path(args.modules_out).write_text(json.dumps(list(sys.modules)))
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
