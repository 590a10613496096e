"""TrainSpec + command -> a Kubeflow MPIJob (kubeflow.org/v2beta1) manifest, as a dict.

Pure. The launcher pod runs mpirun over the worker pods (the MPI operator provides the
hostfile, so no -H); workers run sshd and wait. Workers follow the spec's hosts (one pod per
host, its slots per pod) or are one pod with np slots. Containers get the toolkit's variables
both as pod env and forwarded by `mpirun -x`. Required by v2beta1: apiVersion, kind,
metadata.name, spec.slotsPerWorker, spec.runPolicy, spec.mpiImplementation and
spec.mpiReplicaSpecs.{Launcher,Worker} with replicas and template.spec.containers.
tests/test_mpijob_schema.py validates the result against the operator's own CRD and checks.

The operator names worker pods (and their services) <job name>-worker-<i> and rejects a job
unless the last of those names is a DNS-1035 label: a letter first, at most 63 characters. The
spec's job_name rule (a DNS-1123 label, also used by Slurm) is wider, so it is checked here.

For device cuda every worker container's `resources.limits` asks for `nvidia.com/gpu` (the GPUs
per host, toolkit.render.layout.requested_gpus; Kubernetes sets requests equal to limits for
extended resources), and slotsPerWorker stays its ranks, one GPU each. cpu and auto ask for
none.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from toolkit.engines import MPIJOB_LAUNCHERS
from toolkit.render.launchers import base_env
from toolkit.render.layout import cluster_threads, job_hosts, requested_gpus, uniform_slots
from toolkit.spec import SpecError, TrainSpec

API_VERSION = "kubeflow.org/v2beta1"
GPU_RESOURCE = "nvidia.com/gpu"
"""The NVIDIA device plugin's resource name for a GPU."""
_DNS_1035_LABEL = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")


def _check_pod_names(spec: TrainSpec, workers: int) -> None:
    last_pod = f"{spec.launch.job_name}-worker-{workers - 1}"
    if not _DNS_1035_LABEL.fullmatch(last_pod):
        raise SpecError.single(
            "launch.job_name",
            spec.launch.job_name,
            f"an MPIJob's pods are named <job_name>-worker-<i> (here up to {last_pod!r}), which "
            "the MPI operator requires to be DNS-1035 labels: a lower-case letter first, then "
            "lower-case letters, digits and -, at most 63 characters",
            hint="start the name with a letter and keep it short",
        )


def mpijob_manifest(spec: TrainSpec, command: Sequence[str]) -> dict[str, Any]:
    """The MPIJob manifest; SpecError unless the spec's launcher is mpirun and slots are equal."""
    if spec.launcher not in MPIJOB_LAUNCHERS:
        raise SpecError.single(
            "launch.launcher",
            spec.launcher,
            f"an MPIJob starts ranks with {', '.join(MPIJOB_LAUNCHERS)}",
            hint=f"set launch.launcher: {MPIJOB_LAUNCHERS[0]}",
        )
    slots = uniform_slots(spec)
    if slots is None:
        raise SpecError.single(
            "launch.hosts",
            list(spec.launch.hosts),
            "MPIJob workers all have the same slotsPerWorker",
            hint="give every host the same slots",
        )
    if not command:
        raise SpecError.single("command", [], "must name a script to run")
    workers = len(job_hosts(spec))
    _check_pod_names(spec, workers)
    python = spec.launch.python or "python"
    program = [python, *command] if command[0].endswith(".py") else list(command)
    env = base_env(spec, threads=cluster_threads(spec))
    mpirun_args = ["--allow-run-as-root", "-np", str(spec.world_size), "--bind-to", "none"]
    mpirun_args += ["--map-by", "slot"]
    for name in env:
        mpirun_args += ["-x", name]
    image = spec.launch.image

    def pod_env() -> list[dict[str, str]]:  # a fresh list per container: no YAML anchors
        return [{"name": name, "value": value} for name, value in env.items()]

    def replica(replicas: int, container: dict[str, Any]) -> dict[str, Any]:
        return {"replicas": replicas, "template": {"spec": {"containers": [container]}}}

    worker: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "command": ["/usr/sbin/sshd"],
        "args": ["-De"],
        "env": pod_env(),
    }
    gpus = requested_gpus(spec)
    if gpus is not None:
        worker["resources"] = {"limits": {GPU_RESOURCE: gpus}}

    return {
        "apiVersion": API_VERSION,
        "kind": "MPIJob",
        "metadata": {"name": spec.launch.job_name},
        "spec": {
            "slotsPerWorker": slots,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiImplementation": "OpenMPI",
            "mpiReplicaSpecs": {
                "Launcher": replica(
                    1,
                    {
                        "name": "launcher",
                        "image": image,
                        "command": ["mpirun"],
                        "args": mpirun_args + program,
                        "env": pod_env(),
                    },
                ),
                "Worker": replica(workers, worker),
            },
        },
    }
