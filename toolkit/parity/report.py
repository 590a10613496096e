"""The parity report: a table for people, JSON for machines, and PNG plots of the losses."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.parity.harness import Outcome


def table(outcomes: list[Outcome]) -> str:
    header = f"{'case':<58} {'engine':<28} {'max weight dev':>14} {'final loss dev':>14}  result"
    lines = [header, "-" * len(header)]
    for outcome in outcomes:
        final = (
            abs(outcome.losses[-1] - outcome.reference_losses[-1])
            / abs(outcome.reference_losses[-1])
            if outcome.losses and outcome.reference_losses
            else float("nan")
        )
        result = outcome.status.upper() if outcome.status != "pass" else "pass"
        lines.append(
            f"{outcome.case.name:<58} {outcome.case.engine:<28} "
            f"{outcome.weight_deviation:>14.2e} {final:>14.2e}  {result} "
            f"(tol {outcome.case.tolerance:.0e})"
        )
        if outcome.error:
            lines += [f"    {line}" for line in outcome.error.splitlines()[-8:]]
    passed = sum(o.status == "pass" for o in outcomes)
    lines.append(f"{passed} passed, {len(outcomes) - passed} failed")
    return "\n".join(lines)


def write_json(outcomes: list[Outcome], path: Path, *, steps: int) -> None:
    data = {
        "steps": steps,
        "passed": sum(o.status == "pass" for o in outcomes),
        "failed": sum(o.status != "pass" for o in outcomes),
        "cases": [o.to_json() for o in outcomes],
    }
    path.write_text(json.dumps(data, indent=2))


def write_plots(outcomes: list[Outcome], directory: Path) -> list[Path]:
    """Loss curves per engine beside the reference, and every case's deviation vs tolerance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [o for o in outcomes if o.losses and o.reference_losses]
    written = []
    if curves:
        columns = 4
        rows = (len(curves) + columns - 1) // columns
        figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.6 * rows), squeeze=False)
        for axis, outcome in zip(axes.flat, curves, strict=False):
            steps = range(1, len(outcome.losses) + 1)
            axis.plot(
                steps,
                outcome.reference_losses,
                color="black",
                lw=3,
                alpha=0.3,
                label="single-process reference",
            )
            axis.plot(steps, outcome.losses, "o", ms=3, color="tab:blue", label="engine")
            axis.set_title(outcome.case.name, fontsize=7)
            axis.tick_params(labelsize=7)
        for axis in list(axes.flat)[len(curves) :]:
            axis.axis("off")
        axes.flat[0].legend(fontsize=7)
        figure.supxlabel("optimizer step")
        figure.supylabel("global-batch loss")
        figure.tight_layout()
        path = directory / "parity_losses.png"
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)

    finite = [o for o in outcomes if o.weight_deviation == o.weight_deviation]
    if finite:
        figure, axis = plt.subplots(figsize=(11, 0.28 * len(finite) + 1.2))
        names = [o.case.name for o in finite]
        values = [max(o.weight_deviation, 1e-12) for o in finite]
        colors = ["tab:green" if o.status == "pass" else "tab:red" for o in finite]
        axis.barh(names, values, color=colors)
        axis.scatter(
            [o.case.tolerance for o in finite],
            names,
            marker="|",
            s=200,
            color="black",
            label="tolerance",
            zorder=3,
        )
        axis.set_xscale("log")
        axis.invert_yaxis()
        axis.tick_params(labelsize=7)
        axis.set_xlabel("max |w - w_ref| / max |w_ref| (worst tensor)")
        axis.legend(fontsize=7)
        figure.tight_layout()
        path = directory / "parity_deviation.png"
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)
    return written
