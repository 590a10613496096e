"""The reference architectures as Keras models with the canonical initial weights, and back."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras

from toolkit.parity.architectures import ARCHITECTURES, Layer


def _layer(layer: Layer) -> keras.layers.Layer:
    if layer.kind == "dense":
        return keras.layers.Dense(layer.fan_out)
    if layer.kind == "conv":
        return keras.layers.Conv2D(layer.fan_out, layer.kernel, padding="same")
    if layer.kind == "relu":
        return keras.layers.ReLU()
    return keras.layers.GlobalAveragePooling2D()


def _to_keras(kind: str, weight: np.ndarray) -> np.ndarray:
    # torch Linear [out, in] -> Dense [in, out]; Conv2d [out, in, kh, kw] -> [kh, kw, in, out]
    return weight.T if kind == "dense" else weight.transpose(2, 3, 1, 0)


def _to_torch(kind: str, kernel: np.ndarray) -> np.ndarray:
    return kernel.T if kind == "dense" else kernel.transpose(3, 2, 0, 1)


def build(arch: str, weights: dict[str, np.ndarray]) -> keras.Model:
    layers = ARCHITECTURES[arch]
    input_shape = (8, 8, 1) if arch == "cnn" else (64,)
    model = keras.Sequential([keras.Input(shape=input_shape), *(_layer(layer) for layer in layers)])
    for index, (layer, built) in enumerate(zip(layers, model.layers, strict=True)):
        if layer.kind in ("dense", "conv"):
            kernel = _to_keras(layer.kind, weights[f"{index}.weight"])
            built.set_weights([kernel, weights[f"{index}.bias"]])
    return model


def canonical(arch: str, values_in_order: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Keras weights (kernel, bias per layer, in layer order) under torch names and layouts."""
    values = iter(values_in_order)
    weights: dict[str, np.ndarray] = {}
    for index, layer in enumerate(ARCHITECTURES[arch]):
        if layer.kind in ("dense", "conv"):
            weights[f"{index}.weight"] = _to_torch(layer.kind, next(values))
            weights[f"{index}.bias"] = next(values)
    return weights


def use_fp16() -> None:
    """Keras' mixed_float16 policy for the models built after this, as the TF engines set it."""
    keras.mixed_precision.set_dtype_policy("mixed_float16")


def loss_fn(logits: object, labels: object) -> object:
    """Cross-entropy in float32, also of mixed_float16's fp16 logits (as torch's autocast
    computes its cross-entropy)."""
    logits = keras.ops.cast(logits, "float32")
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
