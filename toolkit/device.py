"""Which device a job trains on: the spec's `device` resolved against the GPUs a host shows.

Pure logic, importing no engine, so that the launcher, the renderers, `toolkit doctor` and every
backend decide the same way (the GPUs a host shows come from `toolkit.gpu_facts`):

- `auto` is CUDA when the host shows a GPU, else the CPU; `cuda` insists on a GPU; `cpu` never
  uses one, even where there are some.
- Under CUDA every rank binds `cuda:<local rank>`, one GPU per rank, so a host with more local
  ranks than visible GPUs is refused before any process group starts (NCCL refuses two ranks on
  one GPU, and sharing one would only hide the mistake until the first collective).
- torch engines create their process groups on NCCL under CUDA and on Gloo on the CPU.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Literal

from toolkit.errors import ToolkitError

DeviceSetting = Literal["auto", "cpu", "cuda"]
Device = Literal["cpu", "cuda"]


def resolve_device(setting: DeviceSetting, visible: int) -> Device:
    """The device a rank trains on, given the spec's setting and the GPUs its host shows."""
    if setting == "cpu":
        return "cpu"
    if setting == "cuda":
        if visible == 0:
            raise ToolkitError(
                "device: cuda, but this host shows no GPU (torch.cuda.is_available() is False "
                "or CUDA_VISIBLE_DEVICES hides every GPU)",
                "run on a GPU host, or set device: auto to train on the CPU where there is none",
            )
        return "cuda"
    return "cuda" if visible > 0 else "cpu"


def announce(setting: DeviceSetting, device: Device, visible: int, rank: int) -> None:
    """Under `device: auto`, rank 0 says once on stderr which device it chose."""
    if setting != "auto" or rank != 0:
        return
    chosen = f"cuda ({visible} GPUs visible)" if device == "cuda" else "cpu (no GPU visible)"
    print(f"toolkit: device auto: {chosen}", file=sys.stderr, flush=True)


def check_gpus_for_ranks(local_ranks: int, visible: int, host: str = "this host") -> None:
    """Refuse more ranks on a host than it has GPUs: each rank binds a GPU of its own."""
    if local_ranks > visible:
        raise ToolkitError(
            f"device cuda: {local_ranks} ranks on {host}, which shows {visible} GPU"
            f"{'' if visible == 1 else 's'}; each rank needs a GPU of its own",
            f"start at most {visible} ranks per host (launch.np, the hosts' slots, "
            "launch.gpus_per_host), or set device: cpu",
        )


def process_group_backend(device: Device) -> Literal["nccl", "gloo"]:
    """torch.distributed's backend for `device`: NCCL between GPUs, Gloo between CPUs."""
    return "nccl" if device == "cuda" else "gloo"


def cuda_visible_count(environ: Mapping[str, str]) -> int | None:
    """GPUs CUDA_VISIBLE_DEVICES admits, or None when it is not set (every GPU is visible).

    CUDA reads the list up to the first entry that is not a device, so "" and "-1" hide them all.
    """
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return None
    count = 0
    for entry in listed.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count
