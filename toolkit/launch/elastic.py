"""Elastic world size (`launch.min_np`): a restarted job continues on the hosts that answer.

Before each restart every host of `launch.hosts` is asked again (ssh and the toolkit's
interpreter, as before any start). When some do not answer and the slots of those that do
hold at least `min_np` ranks, the job starts on them alone; it resumes its newest checkpoint at
the smaller world size, the global batch held: with `batch.micro` given, accumulation grows,
otherwise each rank's micro-batch does (toolkit.spec.batch). When every host answers again,
the next restart uses them all. Too few ranks, or a global batch the smaller world cannot
divide, ends the job with the fault that stopped it and one line saying why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from toolkit.errors import ToolkitError
from toolkit.launch.remote import host_problem
from toolkit.launch.restarts import CannotRestart
from toolkit.spec import TrainSpec
from toolkit.spec.hosts import LOCAL_NAMES, parse_host
from toolkit.spec.sections import SshSpec


def unanswering(ssh: SshSpec, names: Sequence[str], python: str) -> dict[str, str]:
    """Host -> what failed, for every host of `names` that does not answer now (this machine
    always does)."""
    remote = [name for name in names if name not in LOCAL_NAMES]
    with ThreadPoolExecutor(max_workers=max(1, len(remote))) as pool:
        problems = list(pool.map(lambda host: host_problem(ssh, host, python), remote))
    return {host: problem for host, problem in zip(remote, problems, strict=True) if problem}


def on_hosts_that_answer(spec: TrainSpec, gone: Mapping[str, str]) -> TrainSpec:
    """`spec` on its hosts minus `gone`, at the world size their slots give (never more than
    launch.np); CannotRestart when that is below launch.min_np or the batch cannot divide."""
    min_np = spec.launch.min_np
    if not gone or min_np is None:
        return spec
    kept = [entry for entry in spec.launch.hosts if parse_host(entry).name not in gone]
    world = ranks_on(kept, spec.launch.np)
    lost = listed(gone)
    if world < min_np:
        raise CannotRestart(
            f"{world} rank(s) left on the hosts that answer, fewer than launch.min_np={min_np}; "
            f"not answering: {lost}"
        )
    data = spec.to_dict()
    data["launch"]["hosts"] = kept
    data["launch"]["np"] = world if spec.launch.np is not None else None
    try:
        return TrainSpec.from_dict(data)
    except ToolkitError as error:
        raise CannotRestart(
            f"cannot continue on {world} rank(s) ({lost} not answering): {error.message}"
        ) from None


def shrinking(
    spec: TrainSpec, python: str, report: Callable[[str], None]
) -> Callable[[], TrainSpec]:
    """What each restart runs: `spec` on the hosts that answer at that moment, said in one line
    when that is fewer than all of them."""

    def spec_for_restart() -> TrainSpec:
        names = [parse_host(entry).name for entry in spec.launch.hosts]
        gone = unanswering(spec.launch.ssh, names, python)
        smaller = on_hosts_that_answer(spec, gone)
        if smaller is not spec:
            kept = smaller.launch.hosts
            lost = listed(gone)
            report(
                f"toolkit launch: not answering: {lost}; continuing on "
                f"{len(kept)} of {len(names)} hosts with {ranks_on(kept, smaller.launch.np)} "
                f"rank(s) (launch.min_np={spec.launch.min_np})"
            )
        return smaller

    return spec_for_restart


def ranks_on(hosts: Sequence[str], np: int | None) -> int:
    """The world size `hosts` give: their slots, capped by launch.np where it is set."""
    slots = sum(parse_host(entry).slots for entry in hosts)
    return slots if np is None else min(np, slots)


def listed(gone: Mapping[str, str]) -> str:
    """The hosts that do not answer, each with what failed, for one line."""
    return ", ".join(f"{host} ({why})" for host, why in gone.items())
