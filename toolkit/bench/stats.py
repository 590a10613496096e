"""Statistics for side-by-side timings on a shared machine: medians, ratios and their spread.

A launch's figure is the median of its per-step times (robust to the odd step another job's
burst stretched). A repetition's figure is the ratio of two launches made next to each other,
and the result is the median of those ratios with two spreads: min/max over repetitions, and a
bootstrap 95% interval of the median (repetitions resampled with replacement; with fewer than
5 repetitions it is no tighter than min/max, and is reported anyway). An in-process run's
launches are combined instead, every cycle counted (`combine_launches`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    """min over repetitions"""
    high: float
    """max over repetitions"""
    ci_low: float
    """bootstrap 2.5% of the median"""
    ci_high: float
    """bootstrap 97.5% of the median"""
    n: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        return f"{self.median:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}]"


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float))) if values else float("nan")


def spread(values: Sequence[float], *, seed: int = 0) -> Spread:
    """The median of `values` with min/max and a bootstrap 95% interval of the median."""
    data = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if data.size == 0:
        nan = float("nan")
        return Spread(nan, nan, nan, nan, nan, 0)
    ci_low, ci_high = median_interval(data, np.random.default_rng(seed))
    return Spread(
        median=float(np.median(data)),
        low=float(data.min()),
        high=float(data.max()),
        ci_low=ci_low,
        ci_high=ci_high,
        n=int(data.size),
    )


def _resampled_medians(data: np.ndarray, rng: np.random.Generator, samples: int) -> np.ndarray:
    return np.median(rng.choice(data, size=(samples, data.size), replace=True), axis=1)


def median_interval(data: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """The bootstrap 95% interval of the median of `data` (finite values)."""
    low, high = np.percentile(_resampled_medians(data, rng, BOOTSTRAP_SAMPLES), [2.5, 97.5])
    return float(low), float(high)


def median_variance(data: np.ndarray, rng: np.random.Generator) -> float:
    """The bootstrap variance of the median of `data` (finite values)."""
    return float(np.var(_resampled_medians(data, rng, WITHIN_LAUNCH_SAMPLES)))


WITHIN_LAUNCH_SAMPLES = 500
Z_95 = 1.959964


def combine_launches(launches: Sequence[Sequence[float]], *, seed: int = 0) -> Spread:
    """One ratio from the cycle ratios of several in-process launches, as a random-effects
    meta-analysis of the launches (DerSimonian and Laird) on the log scale.

    Each launch's figure is the median of its cycle ratios, with that median's variance from
    a bootstrap over its cycles. The between-launch variance tau^2 is what the launches' spread
    has beyond their own sampling error (0 when they agree as closely as their cycles allow).
    Each launch weighs 1 / (its variance + tau^2); the figure (`median` in the Spread) is the
    weighted mean, its interval that mean ± 1.96 standard errors, both taken back from logs;
    low and high are the launches' own figures' min and max; n counts launches.

    Why not the median of the launches' figures with a bootstrap over launches (what the bench
    reported before): launches spread no more than their cycles' sampling error predicts
    (scripts/launch_estimator_probe.py, over the 25 cases of 5 launches or more on record), so
    a launch of many cycles deserves more weight than one of few. On those cases that interval
    was a quarter wider for the A/A (mean half-width 0.0173 against 0.0138 here) and still left
    out 1 more often (12% of A/A intervals against 8%). This one uses every cycle and widens
    when launches do disagree.
    """
    rng = np.random.default_rng(seed)
    figures, variances = [], []
    for launch in launches:
        logs = _logs(launch)
        if logs.size == 0:
            continue
        figures.append(float(np.median(logs)))
        variances.append(max(median_variance(logs, rng), 1e-12))
    if not figures:
        nan = float("nan")
        return Spread(nan, nan, nan, nan, nan, 0)
    y, v = np.asarray(figures), np.asarray(variances)
    weights = 1.0 / v
    fixed = float(np.sum(weights * y) / np.sum(weights))
    excess = float(np.sum(weights * (y - fixed) ** 2)) - (y.size - 1)
    scale = float(np.sum(weights) - np.sum(weights**2) / np.sum(weights))
    tau2 = max(0.0, excess / scale) if scale > 0 else 0.0
    weights = 1.0 / (v + tau2)
    centre = float(np.sum(weights * y) / np.sum(weights))
    half = Z_95 * float(np.sqrt(1.0 / np.sum(weights)))
    return Spread(
        median=float(np.exp(centre)),
        low=float(np.exp(y.min())),
        high=float(np.exp(y.max())),
        ci_low=float(np.exp(centre - half)),
        ci_high=float(np.exp(centre + half)),
        n=int(y.size),
    )


def _logs(ratios: Sequence[float]) -> np.ndarray:
    return np.log([r for r in ratios if np.isfinite(r) and r > 0])


def launch_figure(ratios: Sequence[float]) -> float:
    """One launch's figure as `combine_launches` takes it: the median of its ratios on the log
    scale (with an even count, the geometric mean of the middle two); NaN with none."""
    logs = _logs(ratios)
    return float(np.exp(np.median(logs))) if logs.size else float("nan")


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Pairwise ratios of same-repetition figures; NaN where either side is missing."""
    return [
        a / b if np.isfinite(a) and np.isfinite(b) and b > 0 else float("nan")
        for a, b in zip(numerators, denominators, strict=True)
    ]


def fit_alpha_beta(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of t = alpha + bytes / beta (the alpha-beta, or Hockney, model):
    latency alpha in seconds and bandwidth beta in bytes per second. Each point is weighted by
    1/t, so small messages (latency) and large ones (bandwidth) both count, and the fit is
    done on relative error. beta is inf when the times do not grow with size."""
    x = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    weights = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * weights[:, None]
    (alpha, slope), *_ = np.linalg.lstsq(design, t * weights, rcond=None)
    beta = 1.0 / slope if slope > 0 else float("inf")
    return float(max(alpha, 0.0)), float(beta)
