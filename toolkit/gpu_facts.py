"""What the NVIDIA driver says about this host's GPUs, read without importing CUDA or an engine.

`toolkit doctor` lists these GPUs and `toolkit plan` measures a rank's memory against the
smallest a job would see, both on machines that may have no driver, no engine or only the
standard library, so this module uses nothing else:

- the GPUs come from one `nvidia-smi --query-gpu` call, bounded by a timeout even when the
  driver is wedged (a hung nvidia-smi can ignore SIGKILL, so it is abandoned, not waited for);
- CUDA_VISIBLE_DEVICES is read the way CUDA reads it (`toolkit.device.cuda_visible_count`):
  up to the first entry that is not a device. Indices follow nvidia-smi's PCI order, which is
  CUDA's only under CUDA_DEVICE_ORDER=PCI_BUS_ID, so where the GPUs differ and indices are
  given in another order, or an entry names no listed GPU (a MIG instance, say), every listed
  GPU counts: the smallest of them is never more than a job gets.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from toolkit.device import cuda_visible_count

NVIDIA_SMI_TIMEOUT_S = 10.0
QUERY_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version")
# After killing a timed-out nvidia-smi, how long to wait for it to go before abandoning it.
KILL_WAIT_S = 1.0


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver lists it; `memory_mib` is None where it reports none ([N/A])."""

    index: int
    uuid: str
    name: str
    memory_mib: int | None
    driver: str


@dataclass(frozen=True)
class GpuListing:
    """The driver's GPUs, or why there are none (`reason`), and CUDA_VISIBLE_DEVICES."""

    gpus: tuple[Gpu, ...] = ()
    reason: str = ""
    cuda_visible_devices: str | None = None
    admitted: tuple[Gpu, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [asdict(gpu) for gpu in self.gpus],
            "reason": self.reason,
            "cuda_visible_devices": self.cuda_visible_devices,
            "visible": [gpu.index for gpu in self.admitted],
        }


def query_argv(smi: str) -> list[str]:
    """The nvidia-smi call that lists every GPU, one CSV line each, without units."""
    return [smi, f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]


def parse_query(text: str) -> tuple[Gpu, ...]:
    """GPUs from `query_argv`'s output; lines that are not a whole record are skipped."""
    gpus = []
    for line in text.splitlines():
        values = [value.strip() for value in line.split(",")]
        if len(values) < len(QUERY_FIELDS) or not values[0].isdigit():
            continue
        index, uuid, *names, memory, driver = values
        name = ", ".join(names)  # a name with a comma in it is split like the fields
        megabytes = int(memory) if memory.isdigit() else None
        gpus.append(Gpu(int(index), uuid, name, megabytes, driver))
    return tuple(gpus)


def admitted_gpus(gpus: Sequence[Gpu], environ: Mapping[str, str]) -> tuple[Gpu, ...]:
    """The listed GPUs a process started with `environ` sees (see the module's docstring)."""
    count = cuda_visible_count(environ)
    if count is None:
        return tuple(gpus)
    entries = [entry.strip() for entry in environ["CUDA_VISIBLE_DEVICES"].split(",")[:count]]
    picked = [_listed(entry, gpus) for entry in entries]
    chosen = tuple(gpu for gpu in picked if gpu is not None)
    if len(chosen) < len(picked) or not _order_is_known(entries, gpus, environ):
        return tuple(gpus)
    return chosen


def list_gpus(environ: Mapping[str, str]) -> GpuListing:
    """Ask the driver for its GPUs; an absent, failing or hung nvidia-smi gives none, and why."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return GpuListing(reason="nvidia-smi not found", cuda_visible_devices=visible)
    output, failure = run_bounded(query_argv(smi), NVIDIA_SMI_TIMEOUT_S)
    gpus = parse_query(output)
    if not gpus:
        reason = failure or "nvidia-smi lists no GPU"
        return GpuListing(reason=reason, cuda_visible_devices=visible)
    return GpuListing(gpus, "", visible, admitted_gpus(gpus, environ))


def visible_gpus(environ: Mapping[str, str]) -> int:
    """How many GPUs a process started on this host with `environ` sees: the driver's list,
    cut to CUDA_VISIBLE_DEVICES where that is set (0 without a driver)."""
    listed = len(list_gpus(environ).gpus)
    admitted = cuda_visible_count(environ)
    return listed if admitted is None else min(listed, admitted)


def smallest(gpus: Sequence[Gpu]) -> Gpu | None:
    """The GPU with the least memory the driver reports, None when it reports none."""
    sized = [gpu for gpu in gpus if gpu.memory_mib is not None]
    return min(sized, key=lambda gpu: (gpu.memory_mib, gpu.index)) if sized else None


def run_bounded(argv: list[str], timeout: float) -> tuple[str, str]:
    """Run `argv` for at most about `timeout` seconds: (stdout, "" or what went wrong)."""
    try:
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, close_fds=True
        )
    except OSError as error:
        return "", f"{argv[0]} did not start ({error.strerror or error})"
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        # One stuck in the driver ignores the kill: abandon it rather than hang the caller.
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=KILL_WAIT_S)
        return "", f"{argv[0]} did not answer in {timeout:g}s"
    if process.returncode != 0:
        said = (stdout.strip() or stderr.strip()).splitlines()
        return stdout, f"{argv[0]} exited {process.returncode}: {said[0] if said else 'no output'}"
    return stdout, ""


def _listed(entry: str, gpus: Sequence[Gpu]) -> Gpu | None:
    """The listed GPU a CUDA_VISIBLE_DEVICES entry names: its index, or its UUID ("GPU-...")
    or a prefix of it that fits one GPU."""
    if entry.isdigit():
        return next((gpu for gpu in gpus if gpu.index == int(entry)), None)
    matches = [gpu for gpu in gpus if entry.startswith("GPU-") and gpu.uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


def _order_is_known(
    entries: Sequence[str], gpus: Sequence[Gpu], environ: Mapping[str, str]
) -> bool:
    """Whether CUDA's index order is nvidia-smi's for these entries: UUIDs only, alike GPUs, or
    CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    if not any(entry.isdigit() for entry in entries):
        return True
    alike = len({(gpu.name, gpu.memory_mib) for gpu in gpus}) <= 1
    return alike or environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
