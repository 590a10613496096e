"""How a detector reads a launcher's variables into a `LaunchEnvironment`.

Most launchers put each fact (rank, world size, local rank, local size, node) in a variable of
its own: `Variables` is that one read routine, configured per launcher by the table in
`toolkit.launch.environment`. Code appears only where a launcher differs: the deepspeed
launcher's --local_rank argument (`DeepSpeedVariables`), Slurm's compressed lists
(`toolkit.launch.slurm`), TF_CONFIG's JSON (`toolkit.launch.tf_config`), and no launcher at all
(`Single`).
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from toolkit.engines import Environment
from toolkit.errors import ToolkitError

STALE_HINT = (
    "the launcher sets this for each process; a value exported by hand or left over from an "
    "outer job gives this result: unset it, or name the launcher explicitly"
)


@dataclass(frozen=True)
class LaunchEnvironment:
    """This process's place in the job, as its launcher described it."""

    launcher: str
    """The detector that recognised the environment, e.g. "torchrun", "openmpi", "single"."""
    rank: int
    local_rank: int
    """Rank among the processes on this machine."""
    world_size: int
    local_world_size: int
    """Number of processes on this machine."""
    node_rank: int
    """Index of this machine in the job."""
    master_addr: str | None = None
    """Rendezvous host the launcher named, if any."""
    master_port: int | None = None
    """Rendezvous port the launcher named, if any. It is already spoken for: rank 0's store for
    torch-style launchers, horovodrun's own Gloo rendezvous server, the first TF_CONFIG task's
    server. Connect to it; an engine that needs a listening port of its own must pick another."""
    hosts: tuple[str, ...] = ()
    """Every host of the job in order, where the launcher lists them (TF_CONFIG: "host:port"
    per task; Slurm: the step's node names); empty otherwise."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def parse_int(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        value = int(raw.strip())
    except ValueError:
        raise ToolkitError(f"{name}={raw!r} is not an integer.", STALE_HINT) from None
    if value < 0:
        raise ToolkitError(f"{name}={raw!r} is negative.", STALE_HINT)
    return value


def _port(env: Mapping[str, str], name: str | None) -> int | None:
    if name is None or not env.get(name):
        return None
    port = parse_int(env, name)
    if not 0 < port < 65536:
        raise ToolkitError(f"{name}={env[name]!r} is not a TCP port (1-65535).", STALE_HINT)
    return port


def _checked(environment: LaunchEnvironment, sources: Mapping[str, str]) -> LaunchEnvironment:
    """Reject a self-contradicting description; `sources` names where each field came from."""
    e = environment
    pairs = (
        ("rank", e.rank, "world_size", e.world_size),
        ("local_rank", e.local_rank, "local_world_size", e.local_world_size),
        ("node_rank", e.node_rank, "world_size", e.world_size),
    )
    if e.world_size < 1:
        raise ToolkitError(
            f"{sources['world_size']}={e.world_size}: must be at least 1.", STALE_HINT
        )
    if e.local_world_size < 1 or e.local_world_size > e.world_size:
        raise ToolkitError(
            f"{sources['local_world_size']}={e.local_world_size} is outside 1.."
            f"{sources['world_size']}={e.world_size}.",
            STALE_HINT,
        )
    for name, value, limit_name, limit in pairs:
        if value >= limit:
            raise ToolkitError(
                f"{sources[name]}={value} is not below {sources[limit_name]}={limit} "
                f"(launcher {e.launcher}).",
                STALE_HINT,
            )
    return e


class Detector(ABC):
    """One launcher's way of describing a process. `required` are the variables whose
    presence means this launcher; `claims` adds conditions that only automatic detection
    checks (naming a launcher explicitly skips them)."""

    name: Environment

    @property
    @abstractmethod
    def required(self) -> tuple[str, ...]: ...

    def missing(self, env: Mapping[str, str]) -> list[str]:
        return [name for name in self.required if name not in env]

    def claims(self, env: Mapping[str, str]) -> bool:
        return True

    def detect(self, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment | None:
        if self.missing(env) or not self.claims(env):
            return None
        return self.read(env, argv)

    @abstractmethod
    def read(self, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        """Describe the process; only called once every `required` variable is present."""


@dataclass(frozen=True, kw_only=True)
class Variables(Detector):
    """A launcher that puts each fact in a variable of its own: most of them. Each field names
    the variable that holds that fact."""

    name: Environment
    rank: str
    world_size: str
    local_rank: str
    local_world_size: str | None
    """None: counted by a rule of the launcher's own (Slurm's per-node lists)."""
    node_rank: str | None = None
    """None: no launcher variable names the node, so it is derived as rank // local size,
    which holds when ranks fill one node before the next (the default of mpirun and hydra)."""
    master_addr: str | None = "MASTER_ADDR"
    master_port: str | None = "MASTER_PORT"
    markers: tuple[str, ...] = ()
    """Further variables that must be present: the ones only this launcher sets."""
    defaults: Mapping[str, int] = field(default_factory=dict)
    """Variables that may be absent, and the value then assumed."""
    excluded_by: tuple[str, ...] = ()
    """Automatic detection passes this launcher over when one of these is set."""

    @property
    def required(self) -> tuple[str, ...]:
        names = (self.rank, self.local_rank, self.world_size, self.local_world_size, self.node_rank)
        return (*self.markers, *(n for n in names if n is not None and n not in self.defaults))

    def claims(self, env: Mapping[str, str]) -> bool:
        return not any(name in env for name in self.excluded_by)

    def _value(self, env: Mapping[str, str], name: str) -> int:
        return (
            parse_int(env, name)
            if name in env or name not in self.defaults
            else self.defaults[name]
        )

    def _local_size(self, env: Mapping[str, str], node_rank: int | None) -> tuple[str, int]:
        """The number of processes on this node, and where it came from."""
        assert self.local_world_size is not None, "a launcher without the variable counts itself"
        return self.local_world_size, self._value(env, self.local_world_size)

    def _hosts(self, env: Mapping[str, str]) -> tuple[str, ...]:
        return ()

    def read(self, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        rank = self._value(env, self.rank)
        named_node = self._value(env, self.node_rank) if self.node_rank else None
        local_size_name, local_size = self._local_size(env, named_node)
        hosts = self._hosts(env)
        environment = LaunchEnvironment(
            launcher=self.name,
            rank=rank,
            local_rank=self._value(env, self.local_rank),
            world_size=self._value(env, self.world_size),
            local_world_size=local_size,
            node_rank=rank // local_size if named_node is None else named_node,
            master_addr=(env.get(self.master_addr) if self.master_addr else None)
            or (hosts[0] if hosts else None),
            master_port=_port(env, self.master_port),
            hosts=hosts,
        )
        sources = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "local_world_size": local_size_name,
            "node_rank": self.node_rank or f"{self.rank} // {local_size_name}",
        }
        return _checked(environment, sources)


@dataclass(frozen=True, kw_only=True)
class DeepSpeedVariables(Variables):
    """The deepspeed launcher also passes --local_rank=N to the script (unless told not to):
    it must agree with LOCAL_RANK."""

    def read(self, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        environment = super().read(env, argv)
        _, argument = split_local_rank_arg(argv)
        if argument is not None and argument != environment.local_rank:
            raise ToolkitError(
                f"--local_rank={argument} in the script's arguments disagrees with "
                f"{self.local_rank}={environment.local_rank}.",
                "pass the script's own arguments after the ones the deepspeed launcher adds, "
                "and do not give --local_rank yourself",
            )
        return environment


class Single(Detector):
    """No launcher: one process, rank 0 of 1."""

    name = "single"
    required = ()

    def read(self, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        return LaunchEnvironment(
            launcher=self.name, rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0
        )


_LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


def script_args(argv: Sequence[str] | None = None) -> list[str]:
    """A script's own arguments (default sys.argv[1:]) without the `--local_rank=N` the
    deepspeed launcher appends: what to hand the script's argparse under every launcher."""
    return split_local_rank_arg(sys.argv[1:] if argv is None else argv)[0]


def split_local_rank_arg(argv: Sequence[str]) -> tuple[list[str], int | None]:
    """Remove the first `--local_rank=N` / `--local_rank N` (or `--local-rank`) from an argv
    list, as the deepspeed launcher appends it, and return the rest and N (None if absent).
    Scripts that parse their own arguments call this on sys.argv first."""
    args = list(argv)
    for position, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if flag not in _LOCAL_RANK_FLAGS:
            continue
        width = 1
        if not equals:
            value = args[position + 1] if position + 1 < len(args) else ""
            width = 2
        if not value.isdigit():
            raise ToolkitError(
                f"{flag} needs a non-negative integer, got {value!r}.",
                f"write {flag}=N, or leave it to the launcher",
            )
        del args[position : position + width]
        return args, int(value)
    return args, None
