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


def forward(arch: str, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The model's logits for digits pixels [N, 64], in numpy from canonical weights: the same
    function every framework's model computes, so that any run's weights can be scored
    without its engine."""
    out = inputs_for(arch, x, "torch").astype(np.float64)
    for index, layer in enumerate(ARCHITECTURES[arch]):
        if layer.kind == "dense":
            out = out @ weights[f"{index}.weight"].T + weights[f"{index}.bias"]
        elif layer.kind == "relu":
            out = np.maximum(out, 0.0)
        elif layer.kind == "gap":
            out = out.mean(axis=(2, 3))
        else:  # conv, stride 1, zero padding kernel // 2: [N, C, H, W]
            pad = layer.kernel // 2
            padded = np.pad(out, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
            windows = np.lib.stride_tricks.sliding_window_view(
                padded, (layer.kernel, layer.kernel), axis=(2, 3)
            )  # [N, C, H, W, kh, kw]
            out = np.einsum("nchwij,ocij->nohw", windows, weights[f"{index}.weight"])
            out = out + weights[f"{index}.bias"][None, :, None, None]
    return out


def held_out_scores(arch: str, weights: dict[str, np.ndarray]) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of the weights on the digits test split."""
    from toolkit.datasets import digits

    data = digits()
    logits = forward(arch, weights, data.x_test)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(len(data.y_test)), data.y_test].mean()
    return float(loss), float((logits.argmax(axis=1) == data.y_test).mean())
