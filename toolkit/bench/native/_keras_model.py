"""The benchmark's MLP in Keras 3: Dense layers of the given widths, ReLU on all but the last."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras


def mlp(dims: list[int]) -> keras.Model:
    hidden = [keras.layers.Dense(width, activation="relu") for width in dims[1:-1]]
    return keras.Sequential([keras.Input(shape=(dims[0],)), *hidden, keras.layers.Dense(dims[-1])])
