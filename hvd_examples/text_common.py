"""What the two text examples (gpt_text.py for torch, keras_text.py for TensorFlow) share, with
neither framework imported: the command line, the corpus as byte blocks, the training loop with
its evaluations, and what rank 0 reports (the metrics line, the plot, the files it writes).

The text is hvd_examples/data/corpus.txt (where it comes from: hvd_examples/data/README.md),
read as bytes, so the vocabulary is the 256 byte values and no tokenizer is needed. Its first
90% is cut into consecutive blocks of BLOCK bytes for training, its last 10% likewise held out;
a trailing partial block is left out. Each block predicts its bytes 2..BLOCK from the ones
before, BLOCK - 1 predictions per block in both examples, so their perplexities compare.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import ToolkitError
from toolkit.report import print_json, weights_digest

CORPUS = Path(__file__).resolve().parent / "data" / "corpus.txt"
BLOCK = 64  # bytes per sample: the models' context
VOCAB = 256
HELD_OUT_FRACTION = 0.1
PROMPT = b"DeepSpeed ZeRO-3 "


def argument_parser(description: str) -> argparse.ArgumentParser:
    """The options both examples take; an example adds its own before parsing."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", help="the training spec; default: the one toolkit launch names")
    parser.add_argument(
        "--steps", type=int, help="optimizer steps to train (default: schedule.total_steps)"
    )
    parser.add_argument("--eval-every", type=int, default=100, help="steps between evaluations")
    parser.add_argument("--max-perplexity", type=float, help="exit 1 when the final one is above")
    parser.add_argument("--plot", help="rank 0 writes the loss and perplexity curves here (PNG)")
    parser.add_argument(
        "--out", help="rank 0 writes weights.npz (full_state_dict) and history.json here"
    )
    return parser


def parse_checked(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parsed arguments, with --steps and --eval-every at least 1 (a ToolkitError otherwise)."""
    args = parser.parse_args(argv)
    for name in ("steps", "eval_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise ToolkitError(f"{flag} {value}: must be at least 1", f"e.g. {flag} 100")
    return args


def steps_to_train(args: argparse.Namespace, spec: Any) -> int:
    """--steps, else the schedule's total_steps (a ToolkitError when neither says)."""
    steps: int | None = args.steps or spec.schedule.total_steps
    if steps is None:
        raise ToolkitError(
            f"{args.spec or 'the spec'}: schedule {spec.schedule.name} has no total_steps to "
            "train for",
            "pass --steps N, or give the spec a schedule with total_steps",
        )
    return steps


@dataclass
class Trained:
    losses: list[float]
    evaluations: list[tuple[int, float]]
    """(step, held-out perplexity) every --eval-every steps and at the end."""
    final: Any
    """The last evaluation's metrics (perplexity, count)."""
    train_seconds: float


def train(
    run: Any,
    train_loader: Any,
    steps: int,
    eval_every: int,
    step: Callable[[Any], float],
    evaluate: Callable[[], Any],
) -> Trained:
    """`steps` optimizer steps (`step` of the micro-batches), evaluating the held-out text every
    `eval_every` steps and once at the end (`evaluate`)."""
    epochs = math.ceil(steps / train_loader.steps_per_epoch)
    losses: list[float] = []
    evaluations: list[tuple[int, float]] = []
    started = time.perf_counter()
    with closing(run.steps(train_loader, epochs=epochs)) as batches:
        for micro_batches in batches:
            if len(losses) == steps:  # here, so that the progress bar counts the last step
                break
            losses.append(step(micro_batches))
            if len(losses) % eval_every == 0 and len(losses) < steps:
                evaluations.append((len(losses), evaluate().perplexity))
    train_seconds = time.perf_counter() - started
    final = evaluate()
    evaluations.append((len(losses), final.perplexity))
    return Trained(losses, evaluations, final, train_seconds)


def report(
    run: Any,
    args: argparse.Namespace,
    weights: dict[str, np.ndarray],
    trained: Trained,
    sample: Callable[[dict[str, np.ndarray]], str],
    title: str,
    **fields: Any,
) -> int:
    """Every rank prints its weights' digest; rank 0 writes --out and --plot and prints the
    metrics line (with `fields` after the job's shape and a text `sample` continues from
    PROMPT). The exit status: 1 when the final perplexity is above --max-perplexity."""
    print_json(rank=run.rank, weights_sha256=weights_digest(weights))
    if run.is_main:
        text = sample(weights)
        if args.out:
            history = {
                "losses": trained.losses,
                "evaluations": trained.evaluations,
                "keys": list(weights),
            }
            write_outputs(args.out, weights, history)
        if args.plot:
            plot(args.plot, trained.losses, trained.evaluations, title, run.loss_label)
        print_json(
            backend=run.spec.backend,
            launcher=run.env.launcher,
            world_size=run.world_size,
            **fields,
            steps=len(trained.losses),
            first_loss=trained.losses[0],
            final_loss=trained.losses[-1],
            perplexity=trained.final.perplexity,
            evaluated_bytes=int(trained.final["count"]),
            train_seconds=round(trained.train_seconds, 1),
            state_dict_entries=len(weights),
            sample=PROMPT.decode() + text,
        )
    perplexity = trained.final.perplexity
    return 0 if args.max_perplexity is None or perplexity <= args.max_perplexity else 1


def blocks(data: np.ndarray) -> np.ndarray:
    """[blocks, BLOCK] int64 byte values."""
    usable = len(data) // BLOCK * BLOCK
    return data[:usable].astype(np.int64).reshape(-1, BLOCK)


def corpus_blocks() -> tuple[np.ndarray, np.ndarray]:
    """(training blocks, held-out blocks): the held-out text is the corpus's last 10%."""
    data = np.frombuffer(CORPUS.read_bytes(), dtype=np.uint8)
    cut = int(len(data) * (1 - HELD_OUT_FRACTION))
    return blocks(data[:cut]), blocks(data[cut:])


def plot(
    path: str,
    losses: list[float],
    evaluations: list[tuple[int, float]],
    title: str,
    loss_label: str,
) -> None:
    """Training loss per step (named as run.loss_label names it: rank 0's own, or the mean
    over the ranks) beside the held-out perplexity at each evaluation (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(range(1, len(losses) + 1), losses)
    left.set(xlabel="optimizer step", ylabel=f"training {loss_label} (nats per byte)", title=title)
    steps, perplexities = zip(*evaluations, strict=True)
    right.plot(steps, perplexities, marker="o")
    right.set(xlabel="optimizer step", ylabel="held-out perplexity", yscale="log")
    right.set_title("held-out perplexity (per byte)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_outputs(directory: str, weights: dict[str, np.ndarray], history: dict[str, Any]) -> None:
    """DIR/weights.npz (the run's full_state_dict) and DIR/history.json (losses, evaluations,
    weight names in order)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = dict(weights)  # numpy's stub would read a key as allow_pickle
    np.savez(out / "weights.npz", **arrays)
    (out / "history.json").write_text(json.dumps(history))
