"""Rank programs of the toolkit side of the benchmarks, run as files under a real launcher:
`toolkit_step.py` (the training step through `toolkit.init`), `toolkit_allreduce.py` (the size
sweep of `run.allreduce` beside the raw paths in `raw_paths.py`) and `memory_probe.py` (resident
memory of a real run, for `toolkit plan`)."""
