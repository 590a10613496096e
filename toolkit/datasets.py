"""Real data that ships offline: scikit-learn's handwritten digits (1,797 8×8 images, 10 classes).

No download is possible on the machines this project runs on, so examples and accuracy checks
use the copy inside the scikit-learn package.

The file is read the way `sklearn.datasets.load_digits` reads it (`np.loadtxt` of the gzipped
CSV, the last column the label), without importing scikit-learn: that import pulls in SciPy, a
large part of every rank's start (docs/engine-notes.md). tests/test_digits.py holds the arrays
to `load_digits`' bit for bit.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

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
    pixels, labels = digits_file()
    order = np.random.default_rng(0).permutation(len(labels))
    x = (pixels[order] / 16.0).astype(np.float32)
    y = labels[order].astype(np.int64)
    return Split(x[:TRAIN_SAMPLES], y[:TRAIN_SAMPLES], x[TRAIN_SAMPLES:], y[TRAIN_SAMPLES:])


def digits_file() -> tuple[np.ndarray, np.ndarray]:
    """The pixels (float64, 0-16) and labels (int) in the file's order, as `load_digits`
    returns them."""
    package = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError("scikit-learn is not installed: it ships the digits data")
    path = Path(package.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, mode="rt", encoding="utf-8") as table:
        data = np.loadtxt(table, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)
