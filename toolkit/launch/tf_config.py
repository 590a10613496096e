"""TF_CONFIG, the one launch description that is JSON rather than one variable per fact."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from toolkit.errors import ToolkitError
from toolkit.launch.detectors import Detector, LaunchEnvironment


def _split_host_port(address: str, source: str) -> tuple[str, int]:
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ToolkitError(
            f"{source} entry {address!r} is not host:port.",
            'write each TF_CONFIG cluster task as "host:port", e.g. "10.0.0.1:2222"',
        )
    return host.strip("[]"), int(port_text)


RANK_ORDER = ("chief", "worker", "ps")
"""TF_CONFIG's task types in the order of the ranks they become."""


class TFConfig(Detector):
    """TF_CONFIG, which tf.distribute reads itself: there is no launcher, the user or an
    operator (Kubeflow's TFJob) writes it per task. The chief, if any, is rank 0, the workers
    follow and the parameter servers come last (toolkit.render.tf.task_of); processes sharing
    a host are that host's local ranks."""

    name = "tf_config"
    required = ("TF_CONFIG",)

    def read(self, env: Mapping[str, str], argv: Sequence[str]) -> LaunchEnvironment:
        hint = (
            'TF_CONFIG is {"cluster": {"worker": ["host:port", ...]}, '
            '"task": {"type": "worker", "index": i}}'
        )
        try:
            config = json.loads(env["TF_CONFIG"])
        except json.JSONDecodeError as error:
            raise ToolkitError(f"TF_CONFIG is not valid JSON ({error}).", hint) from None
        cluster = config.get("cluster") if isinstance(config, dict) else None
        task = config.get("task") if isinstance(config, dict) else None
        if not isinstance(cluster, dict) or not isinstance(task, dict):
            raise ToolkitError("TF_CONFIG needs a 'cluster' and a 'task' object.", hint)
        roles = {kind: cluster.get(kind, []) for kind in RANK_ORDER}
        task_type, index = task.get("type"), task.get("index")
        if task_type not in RANK_ORDER:
            raise ToolkitError(
                f"TF_CONFIG task.type={task_type!r} is not supported: allowed are "
                f"{', '.join(RANK_ORDER)}.",
                "the toolkit runs no evaluator task: evaluate on the chief with run.evaluate",
            )
        members = roles[task_type]
        if not all(isinstance(listed, list) for listed in roles.values()) or not members:
            raise ToolkitError(f"TF_CONFIG cluster.{task_type} is missing or not a list.", hint)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(members):
            raise ToolkitError(
                f"TF_CONFIG task.index={index!r} is not an index into cluster.{task_type} "
                f"({len(members)} entries).",
                hint,
            )
        hosts = tuple(str(address) for kind in RANK_ORDER for address in roles[kind])
        before = RANK_ORDER[: RANK_ORDER.index(task_type)]
        rank = sum(len(roles[kind]) for kind in before) + index
        machines = [_split_host_port(address, "TF_CONFIG")[0] for address in hosts]
        master_addr, master_port = _split_host_port(hosts[0], "TF_CONFIG")
        this_machine = machines[rank]
        return LaunchEnvironment(
            launcher=self.name,
            rank=rank,
            local_rank=machines[:rank].count(this_machine),
            world_size=len(hosts),
            local_world_size=machines.count(this_machine),
            node_rank=list(dict.fromkeys(machines)).index(this_machine),
            master_addr=master_addr,
            master_port=master_port,
            hosts=hosts,
        )
