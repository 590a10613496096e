"""Renderers: pure functions from a TrainSpec to each engine's and launcher's artifacts.

One module per artifact (deepspeed, horovod, tf, hostfile, launchers, slurm, mpijob), plus the
DeepSpeed importer and the ds_configs/ presets. No module here imports an engine.
"""
