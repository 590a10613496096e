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
import os
import sys
from typing import Any

import numpy as np
import torch
from text_common import (
    BLOCK,
    PROMPT,
    VOCAB,
    argument_parser,
    corpus_blocks,
    parse_checked,
    report,
    steps_to_train,
    train,
)
from torch.utils.data import Dataset

import toolkit
from toolkit.report import exit_on_user_error

# Before transformers is imported (in build_model): never reach the Hugging Face hub, and do not
# import TensorFlow, which transformers otherwise loads when it is installed (about 10 s).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("USE_TF", "0")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--width", type=int, default=64, help="embedding width (n_embd)")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (n_layer)")
    return parse_checked(parser, argv)


def model_config(width: int = 64, layers: int = 2) -> Any:
    """The example's model: two heads of `width` / 2 each, `layers` blocks."""
    from transformers import GPT2Config

    # No dropout: each rank would draw its own random masks, so the weights would depend on
    # the number of ranks and no two engines could be compared.
    return GPT2Config(
        vocab_size=VOCAB,
        n_positions=BLOCK,
        n_embd=width,
        n_layer=layers,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def build_model(config: Any = None) -> torch.nn.Module:
    """GPT2LMHeadModel of `config` (model_config() when None; scripts/bench_recompute.py passes a
    larger one): its lm_head.weight is tied to transformer.wte.weight."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(config or model_config())
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


def strict_load(weights: dict[str, np.ndarray], config: Any = None) -> torch.nn.Module:
    """A fresh model of `config` holding `weights`: every name of its state_dict, none other."""
    model = build_model(config)
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
    argv = toolkit.script_args()  # without the deepspeed launcher's --local_rank
    args = parse_args(argv)
    spec = toolkit.load_spec(args.spec)
    steps = steps_to_train(args, spec)
    run = toolkit.init(spec)
    torch.manual_seed(spec.seed)  # every rank builds the same initial weights
    config = model_config(args.width, args.layers)
    run.prepare(build_model(config))
    train_blocks, held_out = corpus_splits()
    train_loader = run.loader(train_blocks, num_workers=args.workers)
    eval_loader = run.loader(held_out, shuffle=False)
    trained = train(
        run,
        train_loader,
        steps,
        args.eval_every,
        step=run.train_step,  # the model returns its own loss
        evaluate=lambda: run.evaluate(eval_loader, token_sums, pairs=False),
    )
    title = f"{spec.backend}, {run.world_size} ranks, {spec.schedule.name}"
    status = report(
        run,
        args,
        run.full_state_dict(),
        trained,
        lambda weights: continue_text(strict_load(weights, config), PROMPT),
        title,
    )
    run.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(exit_on_user_error(main))
