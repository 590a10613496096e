"""Train a small GPT-2 (Hugging Face transformers) on this repository's text, on any torch engine.

The model is built from a `GPT2Config` (nothing is downloaded, ever) and reads bytes: its
vocabulary is the 256 byte values, so it needs no tokenizer. The text is
hvd_examples/data/corpus.txt; its last 10% is held out. Batches are dicts
{"input_ids", "labels"} and the model computes its own loss; the learning rate follows the
spec's schedule (warmup, then cosine decay). The script never names an engine or a launcher:

    S=hvd_examples/specs
    torchrun --nproc_per_node 2 hvd_examples/gpt_text.py --spec $S/gpt_ddp.yaml
    horovodrun -np 2 -H localhost:2 --gloo python hvd_examples/gpt_text.py \
        --spec $S/gpt_horovod.yaml
    deepspeed --num_gpus 2 hvd_examples/gpt_text.py --spec $S/gpt_zero3.yaml
    toolkit launch --spec $S/gpt_zero2.yaml -- hvd_examples/gpt_text.py \
        --spec $S/gpt_zero2.yaml --plot gpt.png

It trains for the schedule's total_steps optimizer steps (--steps to stop earlier), evaluates
the held-out perplexity every --eval-every steps and at the end (exp of the summed next-byte
loss over the number of predicted bytes, both summed over ranks), and on rank 0 shows a
progress bar, loads the trained weights into a fresh GPT2LMHeadModel with strict=True, lets
it continue a prompt, and prints one JSON line of metrics. Every rank prints its weights'
digest. The exit status is 1 when the final perplexity is above --max-perplexity. Measured
perplexities and times: hvd_examples/data/README.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from contextlib import closing
from typing import Any

import numpy as np
import torch
from text_common import BLOCK, PROMPT, VOCAB, corpus_blocks, plot, write_outputs
from torch.utils.data import Dataset

import toolkit
from toolkit.errors import ToolkitError
from toolkit.launch.environment import split_local_rank_arg
from toolkit.report import exit_on_user_error, print_json, weights_digest

# Before transformers is imported (in build_model): never reach the Hugging Face hub, and do not
# import TensorFlow, which transformers otherwise loads when it is installed (about 10 s).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("USE_TF", "0")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the training spec (YAML or JSON)")
    parser.add_argument(
        "--steps", type=int, help="optimizer steps to train (default: schedule.total_steps)"
    )
    parser.add_argument("--eval-every", type=int, default=100, help="steps between evaluations")
    parser.add_argument("--max-perplexity", type=float, help="exit 1 when the final one is above")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--plot", help="rank 0 writes the loss and perplexity curves here (PNG)")
    parser.add_argument(
        "--out", help="rank 0 writes weights.npz (full_state_dict) and history.json here"
    )
    args = parser.parse_args(argv)
    for name in ("steps", "eval_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise ToolkitError(f"{flag} {value}: must be at least 1", f"e.g. {flag} 100")
    return args


def model_config() -> Any:
    from transformers import GPT2Config

    # No dropout: each rank would draw its own random masks, so the weights would depend on
    # the number of ranks and no two engines could be compared.
    return GPT2Config(
        vocab_size=VOCAB,
        n_positions=BLOCK,
        n_embd=64,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def build_model() -> torch.nn.Module:
    """GPT2LMHeadModel: its lm_head.weight is tied to transformer.wte.weight."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(model_config())
    # transformers picks the loss by class name and warns that "GPT2LMHeadModel" matches none;
    # it then uses this one, the causal LM loss.
    model.loss_type = "ForCausalLM"
    return model


class ByteBlocks(Dataset):
    """Byte blocks as {"input_ids", "labels"}; the labels are the inputs, the model shifts
    them to predict each next byte."""

    def __init__(self, blocks: np.ndarray) -> None:
        self.blocks = torch.from_numpy(blocks)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.blocks[index]
        return {"input_ids": ids, "labels": ids}


def corpus_splits() -> tuple[ByteBlocks, ByteBlocks]:
    """(training blocks, held-out blocks), see text_common."""
    train, held_out = corpus_blocks()
    return ByteBlocks(train), ByteBlocks(held_out)


def token_sums(outputs: Any, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A micro-batch's summed next-byte loss and its number of predicted bytes. The model's
    loss is their mean; it predicts every position but the first (labels -100 are skipped)."""
    tokens = (batch["labels"][:, 1:] != -100).sum()
    return {"loss_sum": outputs.loss * tokens, "count": tokens}


def strict_load(weights: dict[str, np.ndarray]) -> torch.nn.Module:
    """A fresh model holding `weights`: every name of its state_dict, none other."""
    model = build_model()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    return model.eval()


def continue_text(model: torch.nn.Module, prompt: bytes, length: int = 48) -> str:
    """The model's greedy continuation of `prompt`, as text."""
    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        for _ in range(length):
            logits = model(input_ids=ids[:, -BLOCK:]).logits
            ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return bytes(ids[0, len(prompt) :].tolist()).decode("utf-8", errors="replace")


def main() -> int:
    argv, _ = split_local_rank_arg(sys.argv[1:])  # the deepspeed launcher appends --local_rank
    args = parse_args(argv)
    spec = toolkit.load_spec(args.spec)
    steps = args.steps or spec.schedule.total_steps
    if steps is None:
        raise ToolkitError(
            f"{args.spec}: schedule {spec.schedule.name} has no total_steps to train for",
            "pass --steps N, or give the spec a schedule with total_steps",
        )
    run = toolkit.init(spec)
    torch.manual_seed(spec.seed)  # every rank builds the same initial weights
    run.prepare(build_model())
    train, held_out = corpus_splits()
    train_loader = run.loader(train, num_workers=args.workers)
    eval_loader = run.loader(held_out, shuffle=False)
    epochs = math.ceil(steps / train_loader.steps_per_epoch)
    losses: list[float] = []
    evaluations: list[tuple[int, float]] = []
    started = time.perf_counter()
    with closing(run.steps(train_loader, epochs=epochs)) as batches:
        for micro_batches in batches:
            if len(losses) == steps:  # here, so that the progress bar counts the last step
                break
            losses.append(run.train_step(micro_batches))  # the model returns its own loss
            if len(losses) % args.eval_every == 0 and len(losses) < steps:
                metrics = run.evaluate(eval_loader, token_sums, pairs=False)
                evaluations.append((len(losses), metrics.perplexity))
    train_seconds = time.perf_counter() - started
    final = run.evaluate(eval_loader, token_sums, pairs=False)
    evaluations.append((len(losses), final.perplexity))
    weights = run.full_state_dict()
    print_json(rank=run.rank, weights_sha256=weights_digest(weights))
    if run.is_main:
        sample = continue_text(strict_load(weights), PROMPT)
        history = {"losses": losses, "evaluations": evaluations, "keys": list(weights)}
        if args.out:
            write_outputs(args.out, weights, history)
        if args.plot:
            title = f"{spec.backend}, {run.world_size} ranks, {spec.schedule.name}"
            plot(args.plot, losses, evaluations, title)
        print_json(
            backend=spec.backend,
            launcher=run.env.launcher,
            world_size=run.world_size,
            steps=len(losses),
            first_loss=losses[0],
            final_loss=losses[-1],
            perplexity=final.perplexity,
            evaluated_bytes=int(final["count"]),
            train_seconds=round(train_seconds, 1),
            state_dict_entries=len(weights),
            sample=PROMPT.decode() + sample,
        )
    run.shutdown()
    return 0 if args.max_perplexity is None or final.perplexity <= args.max_perplexity else 1


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main))
