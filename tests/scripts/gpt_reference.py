"""The GPT example's training as a plain single-process torch loop: what every engine must match.

    python gpt_reference.py --spec S --steps N --out DIR

Same model, data, optimizer and schedule as hvd_examples/gpt_text.py, without the toolkit's
runtime: each optimizer step is one batch of the global size, taken in the global order of
toolkit.sharding (a permutation per seed and epoch); AdamW with the spec's constants, and its
gradient clipping; the learning rate of step k is the peak times lr_ratio(schedule, k)
(toolkit.schedule). The final held-out evaluation covers the whole global batches of the
held-out blocks, in order, as the toolkit's loader does. Writes DIR/weights.npz and
DIR/history.json as gpt_text.py --out does.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hvd_examples"))

import gpt_text
import torch

from toolkit.schedule import lr_ratio
from toolkit.sharding import epoch_order
from toolkit.spec import load_spec


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = load_spec(args.spec)
    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)
    model = gpt_text.build_model()
    opt = spec.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=spec.effective_lr(),
        betas=(opt.betas[0], opt.betas[1]),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        amsgrad=False,
        foreach=False,
    )
    schedule = spec.schedule
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: lr_ratio(schedule, k))
    train, held_out = gpt_text.corpus_splits()
    size = spec.batch_for().global_
    per_epoch = len(train) // size
    losses: list[float] = []
    for step in range(args.steps):
        epoch, index = divmod(step, per_epoch)
        order = epoch_order(len(train), seed=spec.seed, epoch=epoch, shuffle=True)
        ids = train.blocks[torch.from_numpy(order[index * size : (index + 1) * size])]
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        if spec.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip_grad_norm)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
    evaluated = held_out.blocks[: len(held_out) // size * size]
    with torch.no_grad():
        mean = float(model(input_ids=evaluated, labels=evaluated).loss)
    weights = {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}
    history = {
        "losses": losses,
        "evaluations": [(args.steps, math.exp(mean))],
        "keys": list(weights),
    }
    gpt_text.write_outputs(args.out, weights, history)
    return 0


if __name__ == "__main__":
    sys.exit(main())
