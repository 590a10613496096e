"""Cross-field rules of a TrainSpec, every issue collected.

Types and one-field constraints (ranges, patterns, host entries) are checked first, by
`toolkit.spec.typecheck` from the fields' metadata. Each rule here relates several fields and
declares the top-level sections it reads; it is skipped when one of them holds a field that
failed its own check (and was replaced by its default), so one mistake never shows up as a
cascade of made-up ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from toolkit.engines import MPI_LAUNCHERS, ONE_RANK_PER_SLOT, frameworks_of, launcher_refusal
from toolkit.spec.batch import batch_issues
from toolkit.spec.errors import SpecError, SpecIssue
from toolkit.spec.hosts import LOCAL_NAMES
from toolkit.spec.typecheck import check_instance

if TYPE_CHECKING:
    from toolkit.spec.model import TrainSpec

Rule = Callable[["TrainSpec"], Iterable[SpecIssue]]

_MAX_PORT = 65535
MAX_LOCAL_RANKS = 256
"""Most ranks the local launcher starts on one machine."""


def _issue(path: str, value: Any, allowed: str, hint: str | None = None) -> SpecIssue:
    return SpecIssue(path=path, value=value, allowed=allowed, hint=hint)


def _hostfile(spec: TrainSpec) -> Iterator[SpecIssue]:
    if spec.launch.hostfile is not None and not spec.launch.hosts:
        yield _issue(
            "launch.hostfile",
            spec.launch.hostfile,
            "hostfiles are read when a spec is loaded; this spec has no hosts",
            hint="build it with TrainSpec.from_dict or load_spec, or give launch.hosts",
        )


def _backend(spec: TrainSpec) -> Iterator[SpecIssue]:
    allowed = frameworks_of(spec.backend)
    if spec.framework is not None and spec.framework not in allowed:
        yield _issue(
            "framework",
            spec.framework,
            f"backend {spec.backend} runs {' or '.join(allowed)}",
            hint="remove framework to use the backend's own",
        )


def _optimizer(spec: TrainSpec) -> Iterator[SpecIssue]:
    opt = spec.optimizer
    if opt.name != "sgd" and opt.momentum:
        yield _issue(
            "optimizer.momentum",
            opt.momentum,
            f"only sgd uses momentum, not {opt.name}",
            hint="set betas for adam/adamw, or remove momentum",
        )
    if opt.nesterov and (opt.name != "sgd" or opt.momentum <= 0):
        yield _issue(
            "optimizer.nesterov",
            opt.nesterov,
            "needs optimizer.name sgd with momentum > 0",
            hint="set momentum, or remove nesterov",
        )


def _zero(spec: TrainSpec) -> Iterator[SpecIssue]:
    zero = spec.zero
    if zero.stage and spec.backend != "deepspeed":
        yield _issue(
            "zero.stage",
            zero.stage,
            f"ZeRO needs backend deepspeed (backend is {spec.backend})",
            hint="set backend: deepspeed, or zero.stage: 0",
        )
    if zero.offload_optimizer != "none" and zero.stage == 0:
        yield _issue(
            "zero.offload_optimizer",
            zero.offload_optimizer,
            "needs zero.stage 1, 2 or 3",
            hint="raise zero.stage",
        )
    if zero.offload_params != "none" and zero.stage != 3:
        yield _issue(
            "zero.offload_params",
            zero.offload_params,
            f"needs zero.stage 3 (stage is {zero.stage})",
            hint="set zero.stage: 3, or offload_params: none",
        )
    if "nvme" in (zero.offload_optimizer, zero.offload_params) and not zero.nvme_path:
        yield _issue(
            "zero.nvme_path",
            zero.nvme_path,
            "required when offloading to nvme",
            hint="a directory on the NVMe device",
        )


def _offload_optimizer(spec: TrainSpec) -> Iterator[SpecIssue]:
    if spec.zero.offload_optimizer != "none" and spec.optimizer.name == "sgd":
        yield _issue(
            "zero.offload_optimizer",
            spec.zero.offload_optimizer,
            "offloaded optimizer steps run DeepSpeedCPUAdam: optimizer.name must be adam or adamw",
            hint="use adam/adamw, or offload_optimizer: none",
        )


def _pipeline(spec: TrainSpec) -> Iterator[SpecIssue]:
    pipe = spec.pipeline
    if pipe.stages > 1 and spec.backend != "deepspeed":
        yield _issue(
            "pipeline.stages",
            pipe.stages,
            f"pipeline parallelism needs backend deepspeed (backend is {spec.backend})",
            hint="set backend: deepspeed, or pipeline.stages: 1",
        )
    if pipe.stages > 1 and spec.zero.stage > 1:
        yield _issue(
            "zero.stage",
            spec.zero.stage,
            "DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only",
            hint="set zero.stage: 1, or pipeline.stages: 1",
        )


def _launch(spec: TrainSpec) -> Iterator[SpecIssue]:
    launch, launcher = spec.launch, spec.launcher
    # A backend/framework mismatch is reported by _backend; judge the launcher by the backend.
    framework = spec.framework if spec.framework in frameworks_of(spec.backend) else None
    refusal = launcher_refusal(spec.backend, framework, launcher)
    if refusal is not None:
        yield _issue(
            "launch.launcher",
            launcher,
            refusal,
            hint="remove launch.launcher to use the backend's usual one",
        )
    mpi_launched = spec.backend == "horovod" and launcher in MPI_LAUNCHERS
    if mpi_launched and spec.horovod.controller != "mpi":
        yield _issue(
            "horovod.controller",
            spec.horovod.controller,
            f"Horovod under {launcher} runs the mpi controller",
            hint="set horovod.controller: mpi, or launch.launcher: horovodrun",
        )
    hosts = spec.hosts
    slots = sum(host.slots for host in hosts)
    if hosts and launch.np is not None:
        if launcher == "horovodrun" and launch.np > slots:
            yield _issue(
                "launch.np",
                launch.np,
                f"horovodrun needs np <= the hosts' slots ({slots})",
                hint="add slots to launch.hosts, or lower np",
            )
        if launcher in ONE_RANK_PER_SLOT and launch.np != slots:
            yield _issue(
                "launch.np",
                launch.np,
                f"{launcher} starts one rank per slot: np must equal the hosts' slots ({slots})",
                hint="remove launch.np to use the slots",
            )
    if launcher == "torchrun" and len({host.slots for host in hosts}) > 1:
        yield _issue(
            "launch.hosts",
            list(launch.hosts),
            "torchrun runs the same --nproc-per-node on every host: slots must be equal",
            hint="give every host the same slots, or use another launcher",
        )
    if launcher == "local" and (len(hosts) > 1 or any(h.name not in LOCAL_NAMES for h in hosts)):
        yield _issue(
            "launch.hosts",
            list(launch.hosts),
            "the local launcher starts ranks on this machine only (localhost)",
            hint="use srun or mpirun for several hosts",
        )
    if launcher == "local" and spec.world_size > MAX_LOCAL_RANKS:
        yield _issue(
            "launch.np",
            spec.world_size,
            f"the local launcher starts at most {MAX_LOCAL_RANKS} ranks on this machine",
            hint="use srun or mpirun for bigger jobs",
        )
    top_port = spec.tf.port + max([h.slots for h in hosts] or [spec.world_size]) - 1
    if spec.backend == "tf" and top_port > _MAX_PORT:
        yield _issue("tf.port", spec.tf.port, f"workers would need ports up to {top_port}")


def _batch(spec: TrainSpec) -> Iterable[SpecIssue]:
    return batch_issues(spec.batch, spec.world_size, spec.pipeline.stages)


RULES: tuple[tuple[tuple[str, ...], Rule], ...] = (
    (("backend", "framework"), _backend),
    (("optimizer",), _optimizer),
    (("zero", "backend"), _zero),
    (("zero", "optimizer"), _offload_optimizer),
    (("pipeline", "backend", "zero"), _pipeline),
    (("launch",), _hostfile),
    (("launch", "backend", "horovod", "tf"), _launch),
    (("batch", "launch", "pipeline"), _batch),
)
"""(sections read, rule) in the order they run."""


def _section(path: str) -> str:
    return re.split(r"[.\[:]", path, maxsplit=1)[0]


def collect_issues(spec: TrainSpec, *, skip_sections: Iterable[str] = ()) -> list[SpecIssue]:
    """Every rule's issues, skipping rules that read a section with a field-level issue."""
    bad = set(skip_sections)
    issues: list[SpecIssue] = []
    for sections, rule in RULES:
        if bad.intersection(sections):
            continue
        issues.extend(rule(spec))
    return issues


def raise_if_invalid(spec: TrainSpec) -> None:
    """Type-check a spec (it may have been built in Python), then run every rule."""
    issues: list[SpecIssue] = []
    check_instance(spec, "", issues)
    issues.extend(collect_issues(spec, skip_sections={_section(i.path) for i in issues}))
    if issues:
        raise SpecError(issues)
