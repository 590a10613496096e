"""One run of the GPU check (gpu_check.py starts it): the GPT example at the check's size for the
spec's schedule.total_steps, through the toolkit's engine, or with --plain as a plain torch loop.

Both see the same initial weights (torch.manual_seed(spec.seed) before the model is built) and
the same micro-batches: step s is toolkit.sharding's epoch order of the training blocks,
[s*G, (s+1)*G), cut into consecutive micro-batches, as the toolkit's loader cuts it for one rank.
The plain loop is what a user writes without the toolkit: the model on the device, bf16
autocast, torch.optim.AdamW with the spec's constants (and foreach=False, the implementation
the toolkit's torch engines build, so that the two differ by the toolkit alone), clipping, the
spec's schedule. Each step is timed from the end of the one before to the return of its loss
(a float, so the device has finished), data loading included. The result (losses, step times,
held-out loss, peak device memory up to the end of training, and for the plain loop the model's
layer facts for `toolkit plan`) is one JSON file.

The text is hvd_examples/data/corpus.txt cut into blocks of the model's sequence length; the
last global batch of blocks is held out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing, nullcontext
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gpt_text import ByteBlocks, build_model, token_sums
from gpu_check import SIZES, Size
from text_common import CORPUS, VOCAB

import toolkit
from toolkit.device import resolve_device
from toolkit.report import exit_on_user_error
from toolkit.schedule import lr_ratio
from toolkit.sharding import epoch_order
from toolkit.spec import TrainSpec


def model_config(size: Size) -> Any:
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=VOCAB,
        n_positions=size.block,
        n_embd=size.width,
        n_layer=size.layers,
        n_head=size.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def corpus_splits(size: Size, held_out: int) -> tuple[ByteBlocks, ByteBlocks]:
    """(training blocks, the last `held_out` blocks) of the corpus, size.block bytes each."""
    data = np.frombuffer(CORPUS.read_bytes(), dtype=np.uint8)
    blocks = data[: len(data) // size.block * size.block].astype(np.int64)
    blocks = blocks.reshape(-1, size.block)
    return ByteBlocks(blocks[:-held_out]), ByteBlocks(blocks[-held_out:])


def model_facts(model: torch.nn.Module, size: Size, device: torch.device) -> dict[str, Any]:
    """What `toolkit plan` knows of a model (toolkit.plan.model_facts.ModelFacts' fields): each
    leaf module's parameters and its outputs for one sample, from a forward pass of one block."""
    leaves = [m for m in model.modules() if not list(m.children())]
    outputs: dict[int, int] = {}

    def hook(module: torch.nn.Module, _: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            outputs[id(module)] = outputs.get(id(module), 0) + output.numel()

    handles = [leaf.register_forward_hook(hook) for leaf in leaves]
    with torch.no_grad():
        model(input_ids=torch.zeros((1, size.block), dtype=torch.int64, device=device))
    for handle in handles:
        handle.remove()
    layers = [sum(p.numel() for p in leaf.parameters(recurse=False)) for leaf in leaves]
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "largest_layer": max(layers),
        "layer_parameters": layers,
        "layer_activations": [outputs.get(id(leaf), 0) for leaf in leaves],
        "input_elements": size.block,
        "source": "gpu_check: the GPT-2 of the check's size",
    }


def precision(spec: TrainSpec, device: torch.device) -> AbstractContextManager[Any]:
    if spec.precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if spec.precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def plain_batches(
    train: ByteBlocks, spec: TrainSpec, device: torch.device
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Each step's micro-batches, on `device`, in the toolkit's order for one rank."""
    batch = spec.batch_for(1)
    per_epoch = len(train) // batch.global_
    for step in range(spec.schedule.total_steps or 0):
        epoch, index = divmod(step, per_epoch)
        order = epoch_order(len(train), seed=spec.seed, epoch=epoch, shuffle=True)
        ids = train.blocks[torch.from_numpy(order[index * batch.global_ :][: batch.global_])]
        micro = ids.to(device).split(batch.micro)
        yield [{"input_ids": m, "labels": m} for m in micro]


def timed(steps: Iterator[Any], step: Callable[[Any], float]) -> tuple[list[float], list[float]]:
    """(loss, seconds) of every step: from the end of the one before, its data included."""
    losses: list[float] = []
    seconds: list[float] = []
    last = time.perf_counter()
    for micro_batches in steps:
        losses.append(step(micro_batches))
        now = time.perf_counter()
        seconds.append(now - last)
        last = now
    return losses, seconds


def plain_run(spec: TrainSpec, size: Size) -> dict[str, Any]:
    """The plain torch loop of the module docstring, and the model's facts for the plan."""
    resolved = resolve_device(spec.device, torch.cuda.device_count())
    device = torch.device("cuda", 0) if resolved == "cuda" else torch.device("cpu")
    torch.manual_seed(spec.seed)
    model = build_model(model_config(size)).to(device)
    facts = model_facts(model, size, device)
    if device.type == "cuda":  # the peak of training, not of the facts' pass
        torch.cuda.reset_peak_memory_stats(device)
    opt = spec.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=spec.effective_lr(1),
        betas=(opt.betas[0], opt.betas[1]),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        foreach=False,
    )
    schedule = spec.schedule
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: lr_ratio(schedule, k))

    def step(micro_batches: list[dict[str, torch.Tensor]]) -> float:
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for batch in micro_batches:
            with precision(spec, device):
                loss = model(**batch).loss
            (loss / len(micro_batches)).backward()
            losses.append(loss.detach())
        if spec.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip_grad_norm)
        optimizer.step()
        scheduler.step()
        return float(torch.stack(losses).mean())

    train, held_out = corpus_splits(size, spec.batch_for(1).global_)
    trained = timed(plain_batches(train, spec, device), step)
    peak = peak_memory(device)
    with torch.no_grad(), precision(spec, device):
        sums = [token_sums(model(**b), b) for b in plain_eval_batches(held_out, spec, device)]
    eval_loss = float(sum(s["loss_sum"] for s in sums) / sum(s["count"] for s in sums))
    return {
        **result(spec, size, device, trained, eval_loss),
        **peak,
        "state_dict_entries": len(model.state_dict()),
        "facts": facts,
        "parameters": facts["parameters"],
    }


def plain_eval_batches(
    held_out: ByteBlocks, spec: TrainSpec, device: torch.device
) -> list[dict[str, torch.Tensor]]:
    micro = held_out.blocks.to(device).split(spec.batch_for(1).micro)
    return [{"input_ids": m, "labels": m} for m in micro]


def engine_run(spec: TrainSpec, size: Size) -> dict[str, Any]:
    """The same training through toolkit.init, run.prepare, run.loader, run.steps and
    run.train_step; then run.evaluate on the held-out blocks and run.full_state_dict."""
    run = toolkit.init(spec)
    torch.manual_seed(spec.seed)
    model = build_model(model_config(size))
    entries = len(model.state_dict())
    device = next(run.prepare(model).parameters()).device
    train, held_out = corpus_splits(size, spec.batch_for(1).global_)
    loader = run.loader(train)
    steps = spec.schedule.total_steps or 0
    epochs = -(-steps // loader.steps_per_epoch)
    with closing(run.steps(loader, epochs=epochs)) as batches:
        trained = timed(first(batches, steps), run.train_step)
    peak = peak_memory(device)
    metrics = run.evaluate(run.loader(held_out, shuffle=False), token_sums, pairs=False)
    eval_loss = float(metrics["loss_sum"] / metrics["count"])
    weights = run.full_state_dict()
    run.shutdown()
    return {
        **result(spec, size, device, trained, eval_loss),
        **peak,
        "state_dict_entries": len(weights),
        "expected_state_dict_entries": entries,
        "state_dict_on_host": all(isinstance(v, np.ndarray) for v in weights.values()),
        "environment": run.env.launcher,
    }


def first(items: Iterator[Any], count: int) -> Iterator[Any]:
    """The first `count` items, without reading one more (run.steps' bar counts what it hands)."""
    for index, item in enumerate(items):
        if index == count:
            return
        yield item


def peak_memory(device: torch.device) -> dict[str, int | None]:
    """The most bytes the allocator handed out and held so far: an engine's over its whole
    process, the engine's setup included (None on a CPU)."""
    if device.type != "cuda":
        return {"peak_memory_bytes": None, "peak_reserved_bytes": None}
    return {
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
    }


def result(
    spec: TrainSpec,
    size: Size,
    device: torch.device,
    trained: tuple[list[float], list[float]],
    eval_loss: float,
) -> dict[str, Any]:
    """What every run reports: its setting, per-step losses and seconds, held-out loss, peak."""
    losses, seconds = trained
    return {
        "backend": spec.backend,
        "zero_stage": spec.zero.stage,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "losses": losses,
        "step_seconds": seconds,
        "tokens_per_step": spec.batch_for(1).global_ * size.block,
        "eval_loss": eval_loss,
        "versions": versions(),
    }


def versions() -> dict[str, str | None]:
    """Python's, CUDA's and NCCL's versions as torch sees them, and the packages' own."""
    found: dict[str, str | None] = {
        "python": sys.version.split()[0],
        "cuda": torch.version.cuda,
        "nccl": None,
    }
    if torch.cuda.is_available():
        found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    for name in ("torch", "deepspeed", "transformers", "pydantic"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the run's spec (gpu_check.py writes it)")
    parser.add_argument("--size", choices=sorted(SIZES), required=True)
    parser.add_argument("--result", type=Path, required=True, help="the JSON result file")
    parser.add_argument("--plain", action="store_true", help="the plain torch loop")
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args(toolkit.script_args())
    spec = toolkit.load_spec(args.spec)
    size = SIZES[args.size]
    found = (plain_run if args.plain else engine_run)(spec, size)
    args.result.write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main))
