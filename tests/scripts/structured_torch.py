"""Train on a torch Dataset with batches of any structure, evaluate, and report (2 ranks or one).

--model dict: a model that takes a dict batch as keyword arguments and returns its own loss
  (Hugging Face style), with its output layer tied to its embedding (as GPT-2's lm_head is) and
  an integer buffer; read from a map-style Dataset of dict samples by DataLoader workers.
--model pairs: an nn.Sequential trained with loss_fn(outputs, labels) on (features, labels)
  samples, which the pipeline engine can split; under the pipeline engine the script also
  checks that a dict micro-batch is refused with one clear error.

    toolkit launch --spec S -- structured_torch.py --out DIR --model dict --workers 2
    python structured_torch.py --reference --spec S --out DIR --model dict   # plain torch

Rank 0 writes DIR/weights.npz and DIR/report.json; every rank prints its weights digest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
import torch
import torch.nn.functional as F
from structured_data import EPOCHS, HELD_OUT, TRAIN, VOCAB, WIDTH, arrays
from torch.utils.data import Dataset

from toolkit.launch.environment import split_local_rank_arg
from toolkit.report import print_json, weights_digest
from toolkit.sharding import epoch_order
from toolkit.spec import TrainSpec, load_spec


class DictSamples(Dataset):
    def __init__(self, data: dict[str, np.ndarray]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data["labels"])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {name: values[index] for name, values in self.data.items()}


class PairSamples(DictSamples):
    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[override]
        return self.data["features"][index], self.data["labels"][index]


class TiedClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.hidden = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2's lm_head.weight is wte.weight
        self.register_buffer("token_ids", torch.arange(VOCAB))  # an integer buffer

    def forward(
        self, tokens: torch.Tensor, features: torch.Tensor, labels: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        hidden = torch.tanh(self.hidden(self.embed(tokens).mean(dim=1) + features))
        logits = self.head(hidden)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


def build(kind: str) -> torch.nn.Module:
    if kind == "dict":
        return TiedClassifier()
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 16), torch.nn.Tanh(), torch.nn.Linear(16, VOCAB)
    )


def dataset(kind: str, data: dict[str, np.ndarray]) -> Dataset:
    return DictSamples(data) if kind == "dict" else PairSamples(data)


def dict_metrics(outputs: dict[str, torch.Tensor], batch: dict[str, Any]) -> dict[str, Any]:
    count = len(batch["labels"])
    correct = (outputs["logits"].argmax(dim=-1) == batch["labels"]).sum()
    return {"loss_sum": outputs["loss"] * count, "correct": correct, "count": count}


def pair_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    return {
        "loss_sum": F.cross_entropy(logits, labels, reduction="sum"),
        "correct": (logits.argmax(dim=-1) == labels).sum(),
        "count": len(labels),
    }


def engine_run(spec: TrainSpec, kind: str, workers: int) -> tuple[dict[str, Any], dict, bool]:
    import toolkit
    from toolkit.errors import ToolkitError

    run = toolkit.init(spec)
    torch.manual_seed(spec.seed)
    model = build(kind)
    expected_keys = list(model.state_dict())
    run.prepare(model)
    loss_fn = None if kind == "dict" else F.cross_entropy
    train = run.loader(dataset(kind, arrays(TRAIN, 1)), num_workers=workers)
    held_out = run.loader(dataset(kind, arrays(HELD_OUT, 2)), shuffle=False)
    metric_fn: Any = dict_metrics if kind == "dict" else pair_metrics
    pairs = kind != "dict"  # the dict model gets the whole batch; metric_fn(outputs, batch)
    losses: list[float] = []
    for batches in run.steps(train, epochs=EPOCHS):
        losses.append(run.train_step(batches, loss_fn))
        if len(losses) == train.steps_per_epoch:  # mid-training, beside the progress bar
            first_epoch = dict(run.evaluate(held_out, metric_fn, pairs=pairs))
    metrics = run.evaluate(held_out, metric_fn, pairs=pairs)
    own_loss = dict(run.evaluate(held_out, pairs=False)) if kind == "dict" else {}
    weights = run.full_state_dict()
    fresh = build(kind)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    refusal = ""
    if spec.parallel.pipeline > 1:
        sample = DictSamples(arrays(4, 3))[0]
        try:
            run.train_step([{k: np.stack([v] * 4) for k, v in sample.items()}], F.cross_entropy)
        except ToolkitError as error:
            refusal = error.one_line()
    print_json(rank=run.rank, weights_sha256=weights_digest(weights))
    report = {
        "losses": losses,
        "metrics": dict(metrics),
        "first_epoch": first_epoch,
        "accuracy": metrics.accuracy,
        "own_loss": own_loss,
        "keys": list(weights),
        "expected_keys": expected_keys,
        "dtypes": {name: str(value.dtype) for name, value in weights.items()},
        "refusal": refusal,
    }
    is_main = run.is_main
    run.shutdown()
    return report, weights, is_main


def reference(spec: TrainSpec, kind: str) -> tuple[dict[str, Any], dict]:
    """One process, plain torch: each step is one batch of the global size, in the order
    toolkit.sharding gives (the global order every engine must reproduce)."""
    torch.manual_seed(spec.seed)
    model = build(kind)
    opt = spec.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=opt.lr,
        betas=(opt.betas[0], opt.betas[1]),
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        foreach=False,
    )
    data = {name: torch.from_numpy(values) for name, values in arrays(TRAIN, 1).items()}
    size = spec.batch_for().global_
    losses = []
    held_out = {name: torch.from_numpy(values) for name, values in arrays(HELD_OUT, 2).items()}

    def evaluate() -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            if kind == "dict":
                found = dict_metrics(model(**held_out), held_out)
            else:
                found = pair_metrics(model(held_out["features"]), held_out["labels"])
        model.train()
        return {name: float(value) for name, value in found.items()}

    evaluations = []
    for epoch in range(EPOCHS):
        order = epoch_order(TRAIN, seed=spec.seed, epoch=epoch, shuffle=True)
        for step in range(TRAIN // size):
            rows = torch.from_numpy(order[step * size : (step + 1) * size])
            batch = {name: values[rows] for name, values in data.items()}
            if kind == "dict":
                loss = model(**batch)["loss"]
            else:
                loss = F.cross_entropy(model(batch["features"]), batch["labels"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        evaluations.append(evaluate())
    weights = {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}
    report = {
        "losses": losses,
        "metrics": evaluations[-1],
        "first_epoch": evaluations[0],
        "keys": list(weights),
    }
    return report, weights


def main() -> int:
    argv, _ = split_local_rank_arg(sys.argv[1:])  # the deepspeed launcher appends --local_rank
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", choices=["dict", "pairs"], required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    torch.set_num_threads(1)
    if args.reference:
        (report, weights), write = reference(spec, args.model), True
    else:
        report, weights, write = engine_run(spec, args.model, args.workers)
    if write:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "weights.npz", **weights)
        (out / "report.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    from toolkit.report import exit_on_user_error

    sys.exit(exit_on_user_error(main))
