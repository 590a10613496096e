"""Each plan row's memory on one GPU against the GPU's capacity, for jobs that train on CUDA.

Under CUDA every rank has a GPU of its own (toolkit.device), so a row's per-rank memory on the
device (`Memory.device_total`) is what one GPU must hold. The capacity is `--gpu-memory` where
given, else the smallest GPU a job started here would see (toolkit.gpu_facts: the driver's
list cut to CUDA_VISIBLE_DEVICES), else unknown, and then each row says so instead of a verdict.
A plan is compared when it asks for it: `--gpu-memory`, `device: cuda`, or `device: auto` on a
host that shows a GPU (where auto trains on CUDA); a CPU plan has no such block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.device import DeviceSetting, resolve_device
from toolkit.gpu_facts import GpuListing, list_gpus, smallest
from toolkit.plan.table import PlanRow
from toolkit.units import MIB

GIB = float(1 << 30)
COUNTED = (
    "per GPU = one rank's parameters, gradients, fp32 master weights, optimizer state, ZeRO-3's "
    "gathered working set, engine buffers and activations at its high point, less what the "
    "engine never holds together and what offload keeps on the host; not counted: the CUDA "
    "context and kernels (several hundred MiB per process), the caching allocator's fragmentation, "
    "cuBLAS/cuDNN workspaces and NCCL's own buffers, so keep some headroom"
)
NO_ACTIVATIONS = (
    "activations are not counted where the model is not measured (--params): give --model "
    "and --input-shape to count them"
)


@dataclass(frozen=True)
class Capacity:
    """Bytes one GPU holds (None = unknown), and where that figure came from."""

    bytes: float | None
    source: str


@dataclass(frozen=True)
class GpuFit:
    """One plan row on one GPU: its bytes there and what is left (negative: what is missing)."""

    name: str
    per_gpu: float
    headroom: float | None
    activations_counted: bool

    @property
    def fits(self) -> bool | None:
        return None if self.headroom is None else self.headroom >= 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "per_gpu_bytes": self.per_gpu,
            "headroom_bytes": self.headroom,
            "fits": self.fits,
            "activations_counted": self.activations_counted,
        }


def capacity_for(
    setting: DeviceSetting, gpu_memory_gib: float | None, environ: Mapping[str, str]
) -> Capacity | None:
    """The capacity to measure a plan against, or None for a plan that stays on the CPU;
    nvidia-smi is asked only when the spec may train on CUDA and no --gpu-memory is given."""
    if gpu_memory_gib is not None:
        return Capacity(gpu_memory_gib * GIB, f"--gpu-memory {gpu_memory_gib:g}")
    if setting == "cpu":
        return None
    listing = list_gpus(environ)
    if setting != "cuda" and resolve_device(setting, len(listing.admitted)) != "cuda":
        return None
    return smallest_visible(listing)


def smallest_visible(listing: GpuListing) -> Capacity:
    """The memory of the smallest GPU a job here sees, or unknown and why."""
    gpu = smallest(listing.admitted)
    if gpu is None or gpu.memory_mib is None:
        return Capacity(None, listing.reason or "no visible GPU reports its memory")
    named = f"GPU {gpu.index}, {gpu.name}, nvidia-smi"
    return Capacity(float(gpu.memory_mib * MIB), f"the smallest GPU this host shows ({named})")


def fits(rows: Sequence[PlanRow], limit: Capacity) -> list[GpuFit]:
    """Every row's per-GPU bytes, and its headroom under `limit` where that is known."""
    return [
        GpuFit(
            name=row.name,
            per_gpu=row.memory.device_total,
            headroom=None if limit.bytes is None else limit.bytes - row.memory.device_total,
            activations_counted=row.memory.activations is not None,
        )
        for row in rows
    ]


def text(results: Sequence[GpuFit], limit: Capacity) -> str:
    """The per-GPU block printed under the plan's table, in MiB like the table."""
    if limit.bytes is None:
        heading = f"per GPU, capacity unknown ({limit.source}; give --gpu-memory GiB)"
    else:
        size = f"{limit.bytes / GIB:,.1f} GiB ({limit.bytes / MIB:,.0f} MiB)"
        heading = f"per GPU against {size}: {limit.source}"
    lines = [heading, "", f"{'engine':38}{'per GPU':>12}{'headroom':>12}  fits"]
    for result in results:
        headroom = "-" if result.headroom is None else f"{result.headroom / MIB:+,.1f}"
        verdict = {None: "unknown", True: "yes", False: "NO"}[result.fits]
        lines.append(f"{result.name:38}{result.per_gpu / MIB:>12,.1f}{headroom:>12}  {verdict}")
    lines += ["", COUNTED]
    if not all(result.activations_counted for result in results):
        lines.append(NO_ACTIVATIONS)
    return "\n".join(lines)


def to_json(results: Sequence[GpuFit], limit: Capacity) -> dict[str, Any]:
    """The same block as JSON, bytes throughout."""
    return {
        "capacity_bytes": limit.bytes,
        "capacity_source": limit.source,
        "counted": COUNTED,
        "rows": [result.to_json() for result in results],
    }
