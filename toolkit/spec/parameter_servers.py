"""Spec rules for `tf.strategy: parameter_server` (TensorFlow's ParameterServerStrategy).

The job's ranks take roles in order (toolkit.render.tf.task_of): rank 0 is the chief, the last
`tf.ps` ranks are parameter servers, the ranks between are workers. Only the chief reads data:
it hands each step's whole global batch to one free worker, so the job has one data-parallel
replica however many workers run steps at once.
"""

from __future__ import annotations

from collections.abc import Iterator

from toolkit import engines
from toolkit.spec.errors import SpecIssue
from toolkit.spec.sections import CheckpointSpec, TfSpec

NOT_ALONE = "a chief and at least one worker besides the parameter servers"


def parameter_servers(tf: TfSpec) -> bool:
    return tf.strategy == "parameter_server"


def role_issues(
    tf: TfSpec, backend: str, framework: str | None, precision: str
) -> Iterator[SpecIssue]:
    """The strategy only on an engine that has it, and in fp32: Keras' loss scaling checks
    each worker's gradients alone, and workers skipping steps on their own would not follow the
    spec's one rule (toolkit.loss_scaling)."""
    if not parameter_servers(tf):
        return
    able = [e for e in engines.ENGINES if e.parameter_server_class]
    known = framework if framework in engines.frameworks_of(backend) else None
    if engines.engine(backend, known).parameter_server_class is None:
        yield SpecIssue(
            path="tf.strategy",
            value=tf.strategy,
            allowed=f"mirrored with backend {backend}: parameter servers are TensorFlow's "
            "ParameterServerStrategy",
            hint=f"set backend: {' or '.join(dict.fromkeys(e.backend for e in able))}, "
            "or remove tf.strategy",
        )
    if precision != "fp32":
        yield SpecIssue(
            path="tf.strategy",
            value=tf.strategy,
            allowed=f"mirrored with precision {precision}: parameter servers train in fp32 "
            "(each worker would scale and skip its own steps)",
            hint="set precision: fp32, or tf.strategy: mirrored",
        )


def world_issues(tf: TfSpec, world: int | None) -> Iterator[SpecIssue]:
    """Enough ranks for the roles, when the spec fixes the world size."""
    if parameter_servers(tf) and world is not None and world < tf.ps + 2:
        yield SpecIssue(
            path="tf.ps",
            value=tf.ps,
            allowed=f"at most launch np - 2 = {world - 2}: the job needs {NOT_ALONE}",
            hint=f"set launch.np to at least {tf.ps + 2}, or fewer tf.ps",
        )


def checkpoint_issues(tf: TfSpec, checkpoint: CheckpointSpec) -> Iterator[SpecIssue]:
    """The toolkit writes no checkpoint under parameter servers (not built yet)."""
    if parameter_servers(tf) and checkpoint.dir is not None:
        yield SpecIssue(
            path="checkpoint.dir",
            value=checkpoint.dir,
            allowed="unset with tf.strategy parameter_server: the toolkit does not yet save "
            "or resume the parameter servers' variables",
            hint="remove checkpoint.dir, or set tf.strategy: mirrored",
        )


def data_replicas(tf: TfSpec, world: int, replicas_per_process: int) -> int:
    """Ranks that read different samples of each global batch (module docs)."""
    return 1 if parameter_servers(tf) else world * replicas_per_process
