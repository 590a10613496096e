"""The reference models, framework-free: a layer list and seeded initial weights in torch layout.

Weights are named as in a torch `nn.Sequential` ("0.weight", "0.bias", ...) and stored in
torch's layout (Linear: [out, in]; Conv2d: [out, in, kh, kw]); the Keras builder transposes.
That naming is the canonical one every engine's final weights are compared in.

The CNN ends in global average pooling rather than a flatten: flattening NCHW (torch) and NHWC
(Keras) orders features differently, and pooling makes the two frameworks' models the same
function without permuting weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Layer:
    kind: str  # "dense", "conv", "relu", "gap"
    fan_in: int = 0
    fan_out: int = 0
    kernel: int = 0


ARCHITECTURES: dict[str, tuple[Layer, ...]] = {
    # Sequential, so the pipeline engine can split it (2 stages cut between the Linear layers).
    "mlp": (
        Layer("dense", 64, 32),
        Layer("relu"),
        Layer("dense", 32, 32),
        Layer("relu"),
        Layer("dense", 32, 10),
    ),
    "cnn": (
        Layer("conv", 1, 8, 3),
        Layer("relu"),
        Layer("conv", 8, 8, 3),
        Layer("relu"),
        Layer("gap"),
        Layer("dense", 8, 10),
    ),
}


def initial_weights(arch: str, seed: int) -> dict[str, np.ndarray]:
    """torch's default init scheme (uniform ±1/sqrt(fan_in)) drawn from one numpy generator."""
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for index, layer in enumerate(ARCHITECTURES[arch]):
        if layer.kind == "dense":
            shape: tuple[int, ...] = (layer.fan_out, layer.fan_in)
            fan_in = layer.fan_in
        elif layer.kind == "conv":
            shape = (layer.fan_out, layer.fan_in, layer.kernel, layer.kernel)
            fan_in = layer.fan_in * layer.kernel * layer.kernel
        else:
            continue
        bound = 1.0 / np.sqrt(fan_in)
        weights[f"{index}.weight"] = rng.uniform(-bound, bound, shape).astype(np.float32)
        weights[f"{index}.bias"] = rng.uniform(-bound, bound, (layer.fan_out,)).astype(np.float32)
    return weights


def inputs_for(arch: str, x: np.ndarray, framework: str) -> np.ndarray:
    """Digits pixels [N, 64] shaped for the model: images for the CNN, NCHW or NHWC."""
    if arch != "cnn":
        return x
    images = x.reshape(-1, 8, 8)
    return images[:, None, :, :] if framework == "torch" else images[:, :, :, None]
