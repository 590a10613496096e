"""What the two text examples (gpt_text.py for torch, keras_text.py for TensorFlow) share, with
neither framework imported: the corpus as byte blocks, the plot, the files rank 0 writes.

The text is hvd_examples/data/corpus.txt (where it comes from: hvd_examples/data/README.md),
read as bytes, so the vocabulary is the 256 byte values and no tokenizer is needed. Its first
90% is cut into consecutive blocks of BLOCK bytes for training, its last 10% likewise held out;
a trailing partial block is left out. Each block predicts its bytes 2..BLOCK from the ones
before, BLOCK - 1 predictions per block in both examples, so their perplexities compare.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

CORPUS = Path(__file__).resolve().parent / "data" / "corpus.txt"
BLOCK = 64  # bytes per sample: the models' context
VOCAB = 256
HELD_OUT_FRACTION = 0.1
PROMPT = b"DeepSpeed ZeRO-3 "


def blocks(data: np.ndarray) -> np.ndarray:
    """[blocks, BLOCK] int64 byte values."""
    usable = len(data) // BLOCK * BLOCK
    return data[:usable].astype(np.int64).reshape(-1, BLOCK)


def corpus_blocks() -> tuple[np.ndarray, np.ndarray]:
    """(training blocks, held-out blocks): the held-out text is the corpus's last 10%."""
    data = np.frombuffer(CORPUS.read_bytes(), dtype=np.uint8)
    cut = int(len(data) * (1 - HELD_OUT_FRACTION))
    return blocks(data[:cut]), blocks(data[cut:])


def plot(path: str, losses: list[float], evaluations: list[tuple[int, float]], title: str) -> None:
    """Training loss per step beside the held-out perplexity at each evaluation (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(range(1, len(losses) + 1), losses)
    left.set(xlabel="optimizer step", ylabel="training loss (nats per byte)", title=title)
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
