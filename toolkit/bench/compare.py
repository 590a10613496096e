"""`toolkit bench compare`: each spec's engine, briefly, on the same model, in one table.

Each spec runs as written (its engine, launcher, ranks, batch, optimizer and precision) for a
few steps of the bench MLP or of the user's `--model module:factory`, once per repetition, the
specs taking turns. The table gives per spec the median step time, samples per second, the
peak resident memory of its largest rank, and toolkit / native where the engine has a native
script that runs the same step: the bench MLP, SGD and fp32 (the native scripts' step).
"step ms" is the median step, "mean ms" the mean: they part where some steps do more than
others (local SGD averages every k steps).

With `--link IFACE`, rank 0 also counts what its host sends over the network interface IFACE
during the timed steps, and the table gives it as MB sent per step: the bytes an engine and
its compression put on the wire, to hold against the link's rate.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.bench import report
from toolkit.bench.launching import Measured, measure
from toolkit.bench.workload import DEFAULT_LAYERS, Workload
from toolkit.spec import TrainSpec

HEADER = [
    "spec",
    "engine",
    "step ms",
    "mean ms",
    "samples/s",
    "peak MiB/rank",
    "toolkit / native",
]
SENT = "MB/step sent"


@dataclass
class Entry:
    label: str
    spec: TrainSpec
    workload: Workload
    compared_to_native: bool
    toolkit: list[Measured] = field(default_factory=list)
    native: list[Measured] = field(default_factory=list)

    @property
    def step_ms(self) -> float:
        return statistics.median(m.median_ms for m in self.toolkit)

    @property
    def mean_ms(self) -> float:
        return statistics.median(m.mean_ms for m in self.toolkit)

    @property
    def ratio(self) -> float | None:
        if not self.native:
            return None
        pairs = zip(self.toolkit, self.native, strict=True)
        return statistics.median(t.median_ms / n.median_ms for t, n in pairs)

    @property
    def peak_bytes(self) -> int | None:
        peaks = [peak for m in self.toolkit for peak in m.peak_rss_bytes]
        return max(peaks) if peaks else None

    @property
    def sent_bytes_per_step(self) -> float | None:
        """The median over launches of what rank 0's host sent per step; None without a link."""
        sent = [m.sent_bytes_per_step for m in self.toolkit if m.sent_bytes_per_step is not None]
        return statistics.median(sent) if sent else None

    @property
    def engine(self) -> str:
        return f"{self.spec.backend}+{self.spec.framework_name}/{self.spec.launcher}"

    def row(self, *, link: bool) -> list[str]:
        samples = statistics.median(m.samples_per_s for m in self.toolkit)
        cells = [
            self.label,
            self.engine,
            report.milliseconds(self.step_ms),
            report.milliseconds(self.mean_ms),
            f"{samples:.0f}",
            report.mebibytes(self.peak_bytes),
            report.ratio(self.ratio),
        ]
        if link:
            sent = self.sent_bytes_per_step
            cells.append("-" if sent is None else f"{sent / 1e6:.1f}")
        return cells

    def figures(self) -> dict[str, Any]:
        return {
            "spec": self.label,
            "engine": self.engine,
            "toolkit_ms": [m.median_ms for m in self.toolkit],
            "toolkit_mean_ms": [m.mean_ms for m in self.toolkit],
            "native_ms": [m.median_ms for m in self.native],
            "peak_rss_bytes": self.peak_bytes,
            "ratio": self.ratio,
            "sent_bytes_per_step": [m.sent_bytes_per_step for m in self.toolkit],
        }


def workload_of(spec: TrainSpec, layers: tuple[int, ...]) -> Workload:
    """The native scripts' arguments for the step `spec` runs."""
    batch = spec.batch_for()
    optimizer = spec.optimizer
    return Workload(
        layers=layers,
        micro=batch.micro,
        micro_batches=batch.accumulation,
        ranks=spec.world_size,
        lr=optimizer.lr,
        momentum=optimizer.momentum,
        seed=spec.seed,
    )


def same_step_as_native(spec: TrainSpec, model: str | None) -> bool:
    """Whether the engine's native script runs the step `spec` does: the bench MLP, plain SGD
    (momentum allowed), fp32, no clipping, a constant learning rate, and gradients averaged
    every step, uncompressed (the native scripts run neither compression, local SGD, Adasum
    nor parameter servers)."""
    optimizer = spec.optimizer
    return (
        model is None
        and optimizer.name == "sgd"
        and not optimizer.nesterov
        and optimizer.weight_decay == 0
        and spec.precision == "fp32"
        and spec.clip_grad_norm == 0
        and spec.schedule.name == "constant"
        and spec.wire_compression == "none"
        and not spec.ddp.sync.local
        and spec.horovod.op == "average"
        and not spec.parameter_server
    )


def run(
    specs: Sequence[tuple[str, TrainSpec]],
    *,
    model: str | None,
    layers: tuple[int, ...] | None,
    reps: int,
    steps: int,
    warmup: int,
    out: Path,
    link: str | None = None,
) -> int:
    entries = [
        Entry(
            label,
            spec,
            workload_of(spec, layers or DEFAULT_LAYERS),
            same_step_as_native(spec, model),
        )
        for label, spec in specs
    ]
    with tempfile.TemporaryDirectory(prefix="toolkit-compare-") as scratch:
        for rep in range(reps):
            for index, entry in enumerate(entries):
                print(f"bench compare: {entry.label} ({rep + 1}/{reps})", flush=True)
                workdir = Path(scratch) / str(index)
                kinds = ("toolkit", "native") if entry.compared_to_native else ("toolkit",)
                for kind in kinds if rep % 2 == 0 else kinds[::-1]:
                    measured = measure(
                        entry.spec,
                        kind,
                        entry.workload,
                        workdir,
                        steps=steps,
                        warmup=warmup,
                        model=model,
                        link=link,
                    )
                    getattr(entry, kind).append(measured)
    figures = {
        "steps": steps,
        "model": model or "bench MLP",
        "link": link,
        "specs": [e.figures() for e in entries],
    }
    header = [*HEADER, SENT] if link else HEADER
    rows = [entry.row(link=link is not None) for entry in entries]
    report.write(out, "compare", figures, header, rows)
    _plot(entries, out / "compare.png")
    return 0


def _plot(entries: Sequence[Entry], path: Path) -> None:
    """Step time per spec as bars; skipped without matplotlib (the `parity` extra has it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axes = plt.subplots(figsize=(max(4.0, 1.4 * len(entries)), 3.2))
    axes.bar([e.label for e in entries], [e.step_ms for e in entries], color="tab:blue")
    axes.set_ylabel("ms per step (median)")
    axes.set_title("toolkit bench compare")
    axes.tick_params(axis="x", labelrotation=20)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"wrote {path}")
