"""The digits come from scikit-learn's file without importing scikit-learn, bit for bit as
`load_digits` gives them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from sklearn.datasets import load_digits

from toolkit.datasets import TRAIN_SAMPLES, digits, digits_file


def test_the_file_read_directly_is_load_digits_bit_for_bit() -> None:
    pixels, labels = digits_file()
    expected = load_digits()
    assert pixels.dtype == expected.data.dtype and labels.dtype == expected.target.dtype
    np.testing.assert_array_equal(pixels, expected.data)
    np.testing.assert_array_equal(labels, expected.target)


def test_the_split_is_shuffled_scaled_and_typed() -> None:
    split = digits()
    assert split.x_train.shape == (TRAIN_SAMPLES, 64)
    assert split.x_test.shape == (1797 - TRAIN_SAMPLES, 64)
    assert split.x_train.dtype == np.float32 and split.y_train.dtype == np.int64
    assert split.x_train.min() >= 0.0 and split.x_train.max() == 1.0
    assert set(np.unique(split.y_test)) == set(range(10))


def test_loading_the_digits_does_not_import_scikit_learn() -> None:
    probe = (
        "import sys; from toolkit.datasets import digits; digits(); print('sklearn' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
