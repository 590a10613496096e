"""Each rank trains one step of a small model, then reports whether the engine still runs on
its own machinery: no attribute of an engine module or object replaced, no comm hook, the
ranks' environment as the launcher gave it. Started with no arguments by `toolkit launch`
(the spec comes from `toolkit.load_spec()`)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import torch

import toolkit


def shadowed_methods(obj: Any) -> list[str]:
    """Instance attributes that hide a method of the object's class (a patched method)."""
    return sorted(
        name for name in vars(obj) if callable(getattr(type(obj), name, None)) and name != "forward"
    )


def main() -> int:
    import torch.distributed as dist

    own_all_reduce = dist.all_reduce
    spec = toolkit.load_spec()
    run = toolkit.init(spec)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    wrapped = run.prepare(model)
    rng = np.random.default_rng(run.rank)
    x = rng.standard_normal((64, 8), dtype=np.float32)
    y = rng.integers(0, 4, 64)
    for micro_batches in run.steps(run.loader((x, y)), epochs=1):
        run.train_step(micro_batches, torch.nn.functional.cross_entropy)
        break
    checks: dict[str, Any] = {
        "torch_all_reduce_is_torchs": dist.all_reduce is own_all_reduce,
        "no_glibc_tunables": "GLIBC_TUNABLES" not in os.environ,
        "shadowed_methods": shadowed_methods(wrapped),
    }
    if spec.backend == "ddp":
        checks["process_group"] = dist.get_backend()
        checks["comm_hooks"] = len(wrapped._comm_hooks)
    if spec.backend == "deepspeed":
        import deepspeed.comm.comm as deepspeed_comm
        from deepspeed.comm.torch import TorchBackend

        checks["cdb_is_deepspeeds"] = type(deepspeed_comm.cdb) is TorchBackend
        checks["process_group"] = dist.get_backend()
    if spec.backend == "horovod":
        import horovod.torch as hvd
        from horovod.torch import mpi_ops

        checks["synchronize_is_horovods"] = hvd.synchronize is mpi_ops.synchronize
    print(json.dumps({"rank": run.rank, "backend": spec.backend, **checks}), flush=True)
    run.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
