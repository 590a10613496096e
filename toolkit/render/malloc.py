"""How each rank's C allocator (glibc's malloc) treats the memory a step frees.

Finding (`scripts/malloc_probe.py`, docs/bench/findings.md): with glibc's own settings, a torch
training step page-faults much of its temporaries in afresh every step. glibc serves blocks
above its mmap threshold (128 KiB, raised only as such blocks are freed) with a new mapping each
time and gives freed memory at the heap's top back to the kernel (the trim threshold), so the
next step's activations and gradients land on pages the kernel must zero and map again. A CPU
step of the pipeline bubble bench's MLP made 6,800 page faults (about 27 MB); with the mmap
threshold fixed at its upper limit (32 MiB on 64-bit) and trimming left to explicit
`malloc_trim` calls it made 5, in 0.84 of the time (0.79-0.86 over 4 pairs of launches; 0.80 in
a second run). About 90% of those faults are the gradients `zero_grad()` frees every step:
zeroed in place instead, the step faulted 560-760 times and gained nothing resolved. A
GPT-2-shaped model went from 5,600 faults a step to 130, in 0.91 of the time in one run and 0.98
(not resolved) in another. Those are single processes. In 2-rank engine steps of the 8-layer MLP
rank 0 hardly faults under glibc's settings (DDP, whose gradients stay in its buckets: none;
Horovod torch: 512 a step; the pipeline: 1), and no difference was resolved. Like torch's CUDA
caching allocator, this keeps a rank's freed memory for its next step: its resident memory stays
near its high point instead of falling back between steps.

Blocks above 32 MiB: glibc refuses an mmap threshold above that, so until 2026-11-29, when the
settings were that threshold and the trim threshold, every larger block (a 4096×4096 layer's
gradient, a GPT-2 vocabulary's embedding) was still a fresh mapping each time. The settings are
now `mmap_max=0`, under which malloc maps no block of its own whatever the threshold (so none is
set), and the trim threshold. A CPU step of an MLP 1024-4096-4096-10 (one 64 MiB weight, 64
samples, SGD with momentum, one thread) page-faulted 16,385 times a step under glibc's settings
and under the old ones alike, and not at all with `mmap_max=0`: 0.80 of the time (0.78-0.80 over
4 pairs of launches); cloning a 64 MiB tensor took 4.3 ms against 35.3, with or without the
threshold beside `mmap_max=0`. Where the main heap cannot grow (its address range taken), glibc
still maps memory for it, and a thread whose own arena cannot hold a block gets it from the main
heap, so no allocation fails for it.

The tunables go in GLIBC_TUNABLES, which only glibc reads (elsewhere it is ignored); they change
where memory comes from, never a value. They replace a GLIBC_TUNABLES the ranks would inherit
from the launching shell: a user's own goes in `launch.env`, which replaces the toolkit's, or
stays in the shell with `launch.malloc: glibc`, under which the toolkit sets none.
"""

from __future__ import annotations

from toolkit.spec import TrainSpec

MMAP_MAX = 0
"""No block gets a mapping of its own, however large: it comes from the heap and goes back to
it."""
TRIM_THRESHOLD_BYTES = 1 << 62
"""Free memory at the heap's top is never given back on its own; `malloc_trim` still does."""
KEEP_FREED_MEMORY = (
    f"glibc.malloc.mmap_max={MMAP_MAX}:glibc.malloc.trim_threshold={TRIM_THRESHOLD_BYTES}"
)


def environment(spec: TrainSpec) -> dict[str, str]:
    """The allocator variables every rank of `spec` gets."""
    if spec.launch.malloc == "keep":
        return {"GLIBC_TUNABLES": KEEP_FREED_MEMORY}
    return {}
