"""Rank programs of the toolkit side of the benchmarks, run as files under a real launcher:
`toolkit_step.py` (the training step through `toolkit.init`) and `allreduce.py` (the size sweep
of `run.allreduce`). `_toolkit_job.py` holds what they share."""
