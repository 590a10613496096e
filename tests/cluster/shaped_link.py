"""Gradient compression and local SGD on a slow link: `toolkit bench compare` across two
namespace hosts (tests/cluster/netns.py) whose links are shaped to a stated rate with tc's
token bucket filter (`tbf`; this kernel has no `netem`).

    sudo .venv/bin/python -m tests.cluster.shaped_link --rate-mbit 1000 --out docs/bench/link

Every variant is a 2-rank DDP job, one rank per host, on the bench MLP (6.3 M parameters,
25 MB of fp32 gradients a step), each run by its own `toolkit bench compare` (two launches of
it, so that the link's byte counters are the variant's alone). Per variant the report gives:

- step ms: bench compare's median step time;
- compute ms (1 rank): the same variant's step on one rank with one rank's share of the batch,
  no link;
- MB/step: bytes host 1 sends over its link per step (the link's own counters:
  `/sys/class/net/<veth>/statistics/rx_bytes` on the bridge side), from two runs of the
  variant that differ only in their step count, so that what starting a job sends cancels;
- Mbit/s: those bytes over the step time, the rate the step moved data at, to hold against the
  shaped rate.

Found on the first run (docs/engine-notes.md, "Slow links"): the link carried more than its
shaped rate, and every variant sent about 25 MB a step besides its gradients, so the
figures do not yet say how much communication the engines hide behind computation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.netns import INTERFACE, NamespaceCluster, start_namespace_cluster
from tests.realrun import BIN, ROOT

SHORT, STEPS, WARMUP = 4, 14, 2
"""Timed steps of the short and the long launches: the bytes of the STEPS - SHORT steps
between them are the steps' alone, without what starting a job sends."""
BURST = "256kb"


@dataclass(frozen=True)
class Variant:
    name: str
    fields: dict[str, Any]


VARIANTS = (
    Variant("none", {}),
    Variant("fp16", {"compression": "fp16"}),
    Variant("powersgd-r4", {"compression": "powersgd", "ddp": {"powersgd_rank": 4}}),
    Variant("local-sgd-4", {"ddp": {"sync": {"every_steps": 4, "after": 0}}}),
)


def shape(cluster: NamespaceCluster, rate_mbit: int) -> None:
    """Both directions of every host's link at `rate_mbit`: the bridge side's egress (to the
    host) and the host side's (from it)."""
    network = cluster.network
    tbf = ["root", "tbf", "rate", f"{rate_mbit}mbit", "burst", BURST, "latency", "50ms"]
    for address in network.addresses:
        _run(["tc", "qdisc", "replace", "dev", network.links[address], *tbf])
        _run(network.run_at(address, ["tc", "qdisc", "replace", "dev", INTERFACE, *tbf]))


def sent_bytes(cluster: NamespaceCluster, address: str) -> int:
    """What `address` has sent over its link: what the bridge side of it received."""
    link = cluster.network.links[address]
    return int(Path(f"/sys/class/net/{link}/statistics/rx_bytes").read_text())


def spec_for(variant: Variant, launch: dict[str, Any]) -> dict[str, Any]:
    return {
        "backend": "ddp",
        "seed": 1,
        "batch": {"global": 64, "micro": 32},
        "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9},
        "launch": launch,
        **variant.fields,
    }


def bench(specs: list[Path], out: Path, steps: int = STEPS) -> dict[str, Any]:
    argv = [str(BIN / "toolkit"), "bench", "compare", "--reps", "1"]
    argv += ["--steps", str(steps), "--warmup", str(WARMUP), "--out", str(out)]
    for spec in specs:
        argv += ["--spec", str(spec)]
    _run(argv, cwd=ROOT)
    figures: dict[str, Any] = json.loads((out / "compare.json").read_text())
    return figures


def measure(rate_mbit: int, out: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        alone = []
        for variant in VARIANTS:
            path = root / f"alone-{variant.name}.yaml"
            one = spec_for(variant, {"np": 1, "launcher": "torchrun"})
            one["batch"] = {"global": 32, "micro": 32}
            if "ddp" in one and "sync" in one["ddp"]:
                del one["ddp"]["sync"]  # local SGD needs 2 ranks; its compute is the same
            path.write_text(yaml.safe_dump(one))
            alone.append(path)
        measured = _entries(bench(alone, root / "alone"))
        compute = {v.name: e["toolkit_ms"][0] for v, e in zip(VARIANTS, measured, strict=True)}
        with start_namespace_cluster(root / "hosts", 2) as cluster:
            shape(cluster, rate_mbit)
            hosts = [f"{address}:1" for address in cluster.ssh.hosts]
            launch = {**cluster.launch_section(), "hosts": hosts, "launcher": "torchrun"}
            rows = []
            for variant in VARIANTS:
                path = root / f"{variant.name}.yaml"
                path.write_text(yaml.safe_dump(spec_for(variant, launch)))
                # bench compare takes two specs or more: the variant twice, two launches.
                sent = {}
                for steps in (SHORT, STEPS):
                    before = sent_bytes(cluster, cluster.network.addresses[1])
                    twice = _entries(bench([path, path], root / f"{variant.name}{steps}", steps))
                    sent[steps] = sent_bytes(cluster, cluster.network.addresses[1]) - before
                per_step = (sent[STEPS] - sent[SHORT]) / (2 * (STEPS - SHORT))
                step_ms = statistics.median(e["toolkit_ms"][0] for e in twice)
                rows.append(
                    {
                        "variant": variant.name,
                        "step_ms": step_ms,
                        "compute_ms": compute[variant.name],
                        "mb_per_step": per_step / 1e6,
                        "mbit_per_s": per_step * 8 / (step_ms / 1e3) / 1e6,
                    }
                )
    return {"rate_mbit": rate_mbit, "steps": [SHORT, STEPS], "warmup": WARMUP, "rows": rows}


def _entries(figures: dict[str, Any]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = figures["specs"]
    return entries


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"# DDP on a {figures['rate_mbit']} Mbit/s link (2 namespace hosts, one rank each)",
        "",
        "Made by `python -m tests.cluster.shaped_link` (tests/cluster/shaped_link.py says how",
        "each column is measured).",
        "",
        "| variant | step ms | compute ms (1 rank) | MB/step sent | Mbit/s |",
        "|---|---|---|---|---|",
    ]
    for row in figures["rows"]:
        lines.append(
            f"| {row['variant']} | {row['step_ms']:.0f} | {row['compute_ms']:.0f} | "
            f"{row['mb_per_step']:.1f} | {row['mbit_per_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _run(argv: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"`{' '.join(argv)}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate-mbit", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "link")
    args = parser.parse_args()
    figures = measure(args.rate_mbit, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "link.json").write_text(json.dumps(figures, indent=2) + "\n")
    (args.out / "link.md").write_text(report(figures))
    print(report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
