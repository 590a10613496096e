"""`toolkit bench allreduce` output: the text table, and the PNG (bus bandwidth by size, and
toolkit/raw by size)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from toolkit.bench.allreduce import fitted
from toolkit.units import size_label


def a_a_medians(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The raw path against itself, by its label and size (runs since 2026-11-29 keep it)."""
    return {
        label: {size: spread["median"] for size, spread in by_size.items()}
        for label, by_size in data.get("raw_again_over_raw_spread", {}).items()
    }


def ratio_lines(data: dict[str, Any]) -> list[tuple[str, dict[str, float], bool]]:
    """Each toolkit/raw ratio by size, then each raw path's A/A: (label, ratios, is the A/A)."""
    toolkit = [(label, ratios, False) for label, ratios in data["toolkit_over_raw_busbw"].items()]
    a_a = [(f"A/A: {label}", ratios, True) for label, ratios in a_a_medians(data).items()]
    return toolkit + a_a


def table(data: dict[str, Any]) -> str:
    series = data["series"]
    if not series:
        return "no series measured"
    sizes = series[0]["sizes"]
    size_cells = "".join(f"{size_label(s):>9}" for s in sizes)
    fit = fitted(sizes)
    fit_head = f"{'alpha us':>10}{'beta GB/s':>10}" if fit else ""
    lines = [f"{'busbw GB/s':40}{size_cells}{fit_head}"]
    for entry in series:
        cells = "".join(f"{bw:9.3f}" for bw in entry["busbw_gbs"])
        fit_cells = f"{entry['alpha_us']:10.1f}{entry['beta_busbw_gbs']:10.3f}" if fit else ""
        lines.append(f"{entry['label'][:40]:40}{cells}{fit_cells}")
    lines.append("")
    lines.append(f"{'toolkit busbw / raw busbw':40}{size_cells}")
    for label, ratios, _ in ratio_lines(data):
        cells = "".join(f"{ratios.get(str(s), math.nan):9.3f}" for s in sizes)
        lines.append(f"{label[:40]:40}{cells}")
    for error in data["errors"]:
        lines.append(f"error: {error.splitlines()[0]}")
    return "\n".join(lines)


def launch_rows(data: dict[str, Any]) -> list[tuple[str, dict[str, Any], list[float]]]:
    """Each ratio at the run's one size: (label, its pooled spread, each launch's figure), the
    toolkit paths, then the A/As (runs since the nineteenth session keep the launches')."""
    found = []
    for prefix, key in (("", "toolkit_over_raw"), ("A/A: ", "raw_again_over_raw")):
        for label, by_size in data.get(f"{key}_launches", {}).items():
            for size, figures in by_size.items():
                found.append((prefix + label, data[f"{key}_spread"][label][size], figures))
    return found


def plot(data: dict[str, Any], path: Path) -> Path:
    """Bus bandwidth and toolkit/raw by size; for a run of one size (the target's, launched
    again and again), each ratio launch by launch instead (`launches_plot`)."""
    if len({size for entry in data["series"] for size in entry["sizes"]}) == 1:
        return launches_plot(data, path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bandwidth, ratio) = plt.subplots(
        2, 1, figsize=(9, 8), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]}
    )
    memcpy_done = False
    for entry in data["series"]:
        sizes, busbw = entry["sizes"], entry["busbw_gbs"]
        if entry["path"] == "memcpy":
            # One memcpy line per sweep would crowd the plot: the best of them, once.
            continue
        style = "--" if entry["path"].startswith("toolkit") else "-"
        bandwidth.plot(sizes, busbw, style, marker="o", markersize=3, label=entry["label"])
    memcpys = [e for e in data["series"] if e["path"] == "memcpy"]
    if memcpys:
        best = [max(values) for values in zip(*(e["busbw_gbs"] for e in memcpys), strict=True)]
        bandwidth.plot(memcpys[0]["sizes"], best, ":", color="black", label="memcpy, 1 core")
        memcpy_done = True
    bandwidth.set_xscale("log", base=2)
    bandwidth.set_yscale("log")
    bandwidth.set_ylabel("bus bandwidth, GB/s")
    title = f"allreduce, {data['ranks']} ranks, {data['machine']['date'][:10]}"
    bandwidth.set_title(title + (" (memcpy: best of the sweeps)" if memcpy_done else ""))
    bandwidth.legend(fontsize="small", loc="upper left")
    bandwidth.grid(True, which="both", alpha=0.3)
    for label, ratios, is_a_a in ratio_lines(data):
        sizes = sorted(int(size) for size in ratios)
        values = [ratios[str(size)] for size in sizes]
        line_style: dict[str, Any] = (
            {"linestyle": ":", "color": "grey", "linewidth": 1} if is_a_a else {"marker": "o"}
        )
        ratio.plot(sizes, values, label=label, **line_style)
    ratio.axhline(1.0, color="black", linewidth=0.8)
    ratio.set_xscale("log", base=2)
    ratio.set_yscale("log")
    ratio.set_ylabel("toolkit / raw busbw")
    ratio.set_xlabel("message size, bytes")
    # Below the panel: inside it, the legend covered the ratios it names.
    ratio.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    ratio.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def launches_plot(data: dict[str, Any], path: Path) -> Path:
    """Each toolkit/raw ratio and A/A of a one-size run: every launch's figure as a dot, the
    pooled figure with its 95% interval as a bar, against 1 and the target's bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from toolkit.bench.targets import ALLREDUCE_BOUND

    rows = launch_rows(data)
    fig, axes = plt.subplots(figsize=(9, 1.5 + 0.45 * len(rows)))
    for y, (_, spread, figures) in enumerate(rows):
        first = y == 0  # one legend entry each
        axes.plot(
            figures,
            [y] * len(figures),
            "o",
            color="tab:blue",
            alpha=0.5,
            markersize=4,
            label="one launch" if first else None,
        )
        below, above = spread["median"] - spread["ci_low"], spread["ci_high"] - spread["median"]
        axes.errorbar(
            spread["median"],
            y,
            xerr=[[below], [above]],
            fmt="D",
            color="black",
            capsize=4,
            label="pooled, 95% interval" if first else None,
        )
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.axvline(
        ALLREDUCE_BOUND, color="tab:red", linestyle="--", linewidth=0.8, label="target's bound"
    )
    axes.set_yticks(range(len(rows)), [label for label, _, _ in rows])
    axes.invert_yaxis()
    axes.set_xlabel("busbw / raw busbw")
    axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    sizes = sorted({size for entry in data["series"] for size in entry["sizes"]})
    launches = max(data.get("launches", {}).values(), default=1)
    axes.set_title(
        f"allreduce at {', '.join(map(size_label, sizes))}, {data['ranks']} ranks, "
        f"{launches} launches, {data['machine']['date'][:10]}"
    )
    axes.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
