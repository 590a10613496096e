"""Engines, compression and local SGD on a slow link: `toolkit bench compare --link` across two
namespace hosts (tests/cluster/netns.py) whose links are shaped to a stated rate with tc's
token bucket filter (`tbf`; this kernel has no `netem`).

    sudo .venv/bin/python -m tests.cluster.shaped_link --rate-mbit 1000 --out docs/bench/link

Every variant is a 2-rank job, one rank per host, one compute thread per rank, on the bench
MLP (6.3 M parameters, 25 MB of fp32 gradients a step). Per variant the report gives:

- step ms: `bench compare`'s mean step time across the link (the mean, not the median: local
  SGD's averaging steps are one in k);
- compute ms: the same spec's mean step with one rank and that rank's share of the batch, no
  link;
- MB/step: what rank 0's host sent over its link per timed step (`bench compare --link
  tknet`, the host's own interface counter);
- wire ms: those bytes at the shaped rate, the time the link needs for them;
- hidden: of the time that could overlap (the shorter of compute and wire), the share that
  did: (compute + wire - step) / min(compute, wire), clipped to 0..1. 0 when the step computes
  and then waits for every byte; 1 when the shorter of the two hides wholly behind the other.

Two tables, at 32 and at 256 samples per rank (`--micro`): the gradients are the same, the
computing to hide them behind grows with the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.netns import INTERFACE, NamespaceCluster, start_namespace_cluster
from tests.realrun import BIN, ROOT

STEPS, WARMUP = 12, 3
"""Timed steps a multiple of local SGD's period (4), so that its mean counts whole periods."""
BURST = "256kb"


@dataclass(frozen=True)
class Variant:
    name: str
    launcher: str
    fields: dict[str, Any]


def _ddp(**fields: Any) -> dict[str, Any]:
    return {"backend": "ddp", **fields}


def _zero2(overlap: bool, **fields: Any) -> dict[str, Any]:
    return {"backend": "deepspeed", "zero": {"stage": 2, "overlap_comm": overlap}, **fields}


VARIANTS = (
    Variant("ddp", "torchrun", _ddp()),
    Variant("ddp-bucket-1mb", "torchrun", _ddp(ddp={"bucket_cap_mb": 1})),
    Variant("ddp-fp16", "torchrun", _ddp(compression="fp16")),
    Variant("ddp-powersgd-r4", "torchrun", _ddp(compression="powersgd", ddp={"powersgd_rank": 4})),
    Variant("ddp-local-sgd-4", "torchrun", _ddp(ddp={"sync": {"every_steps": 4, "after": 0}})),
    Variant("horovod", "horovodrun", {"backend": "horovod"}),
    Variant(
        "horovod-no-fusion",
        "horovodrun",
        {"backend": "horovod", "horovod": {"fusion_threshold_mb": 0}},
    ),
    Variant("horovod-fp16", "horovodrun", {"backend": "horovod", "compression": "fp16"}),
    Variant("zero2", "torchrun", _zero2(False)),
    Variant("zero2-overlap", "torchrun", _zero2(True)),
    Variant("zero2-fp16", "torchrun", _zero2(True, compression="fp16")),
)


def shape(cluster: NamespaceCluster, rate_mbit: int) -> None:
    """Both directions of every host's link at `rate_mbit`: the bridge side's egress (to the
    host) and the host side's (from it)."""
    network = cluster.network
    tbf = ["root", "tbf", "rate", f"{rate_mbit}mbit", "burst", BURST, "latency", "50ms"]
    for address in network.addresses:
        _run(["tc", "qdisc", "replace", "dev", network.links[address], *tbf])
        _run(network.run_at(address, ["tc", "qdisc", "replace", "dev", INTERFACE, *tbf]))


def spec_for(variant: Variant, launch: dict[str, Any], ranks: int, micro: int) -> dict[str, Any]:
    fields = dict(variant.fields)
    if ranks == 1 and "ddp" in fields:
        fields["ddp"] = {k: v for k, v in fields["ddp"].items() if k != "sync"}  # needs 2 ranks
    if variant.launcher == "horovodrun" and "ssh" in launch:
        # horovodrun has no option for an ssh config file: the host keys come from the ssh on
        # PATH (`bench`'s environment), as from ~/.ssh/config on a real cluster.
        launch = {**launch, "ssh": {k: v for k, v in launch["ssh"].items() if k != "config_file"}}
    return {
        "seed": 1,
        "batch": {"global": micro * ranks, "micro": micro},
        "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9},
        "launch": {**launch, "launcher": variant.launcher, "threads_per_rank": 1},
        **fields,
    }


def bench(
    specs: list[Path], out: Path, link: str | None = None, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    argv = [str(BIN / "toolkit"), "bench", "compare", "--reps", "1"]
    argv += ["--steps", str(STEPS), "--warmup", str(WARMUP), "--out", str(out)]
    argv += ["--link", link] if link else []
    for spec in specs:
        argv += ["--spec", str(spec)]
    _run(argv, cwd=ROOT, env=env)
    entries: list[dict[str, Any]] = json.loads((out / "compare.json").read_text())["specs"]
    return entries


def measure(rate_mbit: int, micros: list[int]) -> dict[str, Any]:
    """One table per micro-batch size: the same gradients a step, more computing to hide
    them behind as the batch grows."""
    tables = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        compute = {}
        for micro in micros:
            alone = _write(root / f"alone{micro}", {"np": 1}, ranks=1, micro=micro)
            entries = bench(alone, root / f"alone{micro}" / "out")
            compute[micro] = [entry["toolkit_mean_ms"][0] for entry in entries]
        with start_namespace_cluster(root / "hosts", 2) as cluster:
            shape(cluster, rate_mbit)
            hosts = [f"{address}:1" for address in cluster.ssh.hosts]
            launch = {**cluster.launch_section(), "hosts": hosts}
            for micro in micros:
                specs = _write(root / f"linked{micro}", launch, ranks=2, micro=micro)
                linked = bench(specs, root / f"linked{micro}" / "out", INTERFACE, cluster.ssh.env())
                measured = zip(VARIANTS, linked, compute[micro], strict=True)
                rows = [_row(*entry, rate_mbit) for entry in measured]
                tables.append({"micro": micro, "rows": rows})
    return {"rate_mbit": rate_mbit, "steps": STEPS, "warmup": WARMUP, "tables": tables}


def _row(
    variant: Variant, entry: dict[str, Any], compute_ms: float, rate_mbit: int
) -> dict[str, Any]:
    step_ms = entry["toolkit_mean_ms"][0]
    sent = entry["sent_bytes_per_step"][0]
    wire_ms = sent * 8 / (rate_mbit * 1e6) * 1e3
    hideable = min(compute_ms, wire_ms)
    hidden = (compute_ms + wire_ms - step_ms) / hideable if hideable > 0 else 0.0
    return {
        "variant": variant.name,
        "engine": entry["engine"],
        "fields": variant.fields,
        "step_ms": step_ms,
        "compute_ms": compute_ms,
        "mb_per_step": sent / 1e6,
        "wire_ms": wire_ms,
        "hidden": min(1.0, max(0.0, hidden)),
    }


def _write(folder: Path, launch: dict[str, Any], *, ranks: int, micro: int) -> list[Path]:
    folder.mkdir(parents=True)
    paths = []
    for variant in VARIANTS:
        path = folder / f"{variant.name}.yaml"
        path.write_text(yaml.safe_dump(spec_for(variant, launch, ranks, micro)))
        paths.append(path)
    return paths


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"# 2 ranks on a {figures['rate_mbit']} Mbit/s link (2 namespace hosts, one rank each)",
        "",
        "Made by `python -m tests.cluster.shaped_link` (tests/cluster/shaped_link.py says how",
        "each column is measured); the specs' fields are in link.json.",
    ]
    for table in figures["tables"]:
        lines += [
            "",
            f"## {table['micro']} samples per rank per step",
            "",
            "| variant | engine | step ms | compute ms (1 rank) | MB/step sent | wire ms "
            "| hidden |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in table["rows"]:
            lines.append(
                f"| {row['variant']} | {row['engine']} | {row['step_ms']:.0f} | "
                f"{row['compute_ms']:.0f} | {row['mb_per_step']:.1f} | {row['wire_ms']:.0f} | "
                f"{row['hidden']:.0%} |"
            )
    return "\n".join(lines) + "\n"


def _run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    environ = None if env is None else {**os.environ, **env}
    done = subprocess.run(argv, cwd=cwd, env=environ, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"`{' '.join(argv)}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate-mbit", type=int, default=1000)
    parser.add_argument(
        "--micro", type=int, nargs="+", default=[32, 256], help="samples per rank per step"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "link")
    args = parser.parse_args()
    figures = measure(args.rate_mbit, args.micro)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "link.json").write_text(json.dumps(figures, indent=2) + "\n")
    (args.out / "link.md").write_text(report(figures))
    print(report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
