"""`toolkit plan`: per-rank memory, bytes communicated per step and the pipeline bubble of every
engine for one spec and one model, before anything runs.

- `model_facts`: what the plan needs to know about the model (parameter count, its largest
  layer, activations per sample), from a count or from the model itself.
- `memory`: bytes per rank by component for each engine and ZeRO stage, with and without offload.
- `communication`: bytes each rank sends per optimizer step, and the pipeline bubble.
- `table`: the rows `toolkit plan` prints and writes.
- `gpu`: for a job on CUDA, each row's memory on one GPU against the GPU's capacity.

Imports no engine, except `model_facts.from_factory`, which builds the user's torch model.
"""
