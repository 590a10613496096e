"""Rank programs of the toolkit side of the benchmarks, run as files under a real launcher:
`toolkit_step.py` (the training step through `toolkit.init`), `inprocess_step.py` (native and
toolkit steps alternating in the same processes), `toolkit_allreduce.py` (the size sweep of
`run.allreduce` beside the raw paths in `raw_paths.py`), `memory_probe.py` (resident memory of a
real run, for `toolkit plan`) and `bubble_probe.py` (DeepSpeed's pipeline schedule, timed
instruction by instruction). `_toolkit_job.py` holds what they share."""
