"""Checkpoints: one portable on-disk format for every engine and world size.

A checkpoint directory (`checkpoint.dir` in the spec) holds committed steps and a pointer:

    DIR/latest                          "step-000200"
    DIR/step-000200/manifest.json       format version, toolkit version, created, step,
                                        backend, framework, world size, spec, optimizer
                                        scalars, extras, and per file: section, bytes,
                                        sha256 and every tensor's name, dtype and shape
    DIR/step-000200/manifest.json.sha256
    DIR/step-000200/model.safetensors   full fp32 weights by state_dict name
    DIR/step-000200/optimizer.safetensors            "<slot>/<param>" tensors, or shards:
    DIR/step-000200/optimizer-rank{r}-of-{n}.safetensors   each rank the names it owns
    DIR/step-000200/arrays.safetensors  other arrays (RNG states), whole or sharded alike

Tensors are safetensors (numpy, no pickle anywhere); a section's files are merged by tensor
name when read, and a tensor may be stored in parts (`Fragment`: a rank's slice of the
flattened tensor, as ZeRO partitions it; `Block`: a rank's rectangular block, as FSDP and
tensor parallelism shard it) that the reader puts back together, so the
partitioning that wrote a checkpoint never matters to the one that reads it.

For engine integration (the whole API; bad input, damaged or foreign files and failed
writes are each one ToolkitError naming the file):

    CheckpointState(step, model, optimizer, scalars, arrays, extras)   plain numpy + JSON
    optimizer_key(slot, param) / split_optimizer_key(key)              "exp_avg/fc.weight"
    Origin(backend, framework, world_size, spec)                       who saved it

    write_checkpoint(DIR, state, origin=..., keep=N) -> DIR/step-N     one process has it all
    begin_save(DIR, step, rank=r, ranks=n) -> PendingSave              every rank, then
        .write(section, tensors, whole=False) ; .finish()              its own files,
    commit_save(DIR, step, ranks=n, origin, scalars, extras, keep)     rank 0 after a barrier
    Fragment(data, offset, shape)           a value for .write: elements [offset, offset +
                                            data.size) of the flattened tensor of `shape`
    Block(data, start, shape)               a value for .write: data is the block of
                                            the tensor of `shape` that starts at `start`

    latest(DIR) -> Path | None                                         newest complete step
    newest_verified(DIR) -> Newest(checkpoint, passed_over)            latest, or the newest
                                            older one whose every file verifies; why the
                                            newer ones were passed over
    refuse_used_target(DIR)                 an import's target must hold no checkpoint yet
    open_checkpoint(DIR or DIR/step-N) -> Checkpoint                   manifest verified;
        .manifest, .step, .names(section), .tensors(section, names=None), .state(),
        .verify()                           every file's size and sha256, keeping nothing
    read_checkpoint(DIR or DIR/step-N) -> CheckpointState              all of it

`run.save(dir)` / `run.load(dir)` write and read this format for every engine (the engines'
side: `Backend.capture_state` / `restore_state`). save_weights / load_weights, the older
weights-only .npz, are kept for files written before.
"""

from toolkit.checkpoint.fragments import Block, Fragment
from toolkit.checkpoint.legacy import load_weights, save_weights
from toolkit.checkpoint.manifest import FORMAT_VERSION, SECTIONS, Manifest, Origin
from toolkit.checkpoint.read import (
    Checkpoint,
    Newest,
    latest,
    newest_verified,
    open_checkpoint,
    read_checkpoint,
    refuse_used_target,
)
from toolkit.checkpoint.state import CheckpointState, optimizer_key, split_optimizer_key
from toolkit.checkpoint.write import PendingSave, begin_save, commit_save, write_checkpoint

__all__ = [
    "FORMAT_VERSION",
    "SECTIONS",
    "Block",
    "Checkpoint",
    "CheckpointState",
    "Fragment",
    "Manifest",
    "Newest",
    "Origin",
    "PendingSave",
    "begin_save",
    "commit_save",
    "latest",
    "load_weights",
    "newest_verified",
    "open_checkpoint",
    "optimizer_key",
    "read_checkpoint",
    "refuse_used_target",
    "save_weights",
    "split_optimizer_key",
    "write_checkpoint",
]
