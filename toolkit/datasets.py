"""Real data that ships offline: scikit-learn's handwritten digits (1,797 8×8 images, 10 classes).

No download is possible on the machines this project runs on, so examples and accuracy checks
use the copy inside the scikit-learn package.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TRAIN_SAMPLES = 1536  # divisible by every global batch the examples use; the rest is held out


@dataclass(frozen=True)
class Split:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def digits() -> Split:
    """Pixels scaled to [0, 1] as float32, labels int64; the same shuffled split every time.

    The file is ordered by writer, so a plain head/tail split tests on unseen writers only;
    a fixed permutation mixes them, as a random split would, but reproducibly.
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    x = (data.data[order] / 16.0).astype(np.float32)
    y = data.target[order].astype(np.int64)
    return Split(x[:TRAIN_SAMPLES], y[:TRAIN_SAMPLES], x[TRAIN_SAMPLES:], y[TRAIN_SAMPLES:])
