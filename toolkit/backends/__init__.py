"""One package per engine; the only place that imports torch, horovod, deepspeed or tensorflow.

Each engine package holds a `probe` module (what `toolkit doctor` runs in a subprocess) and,
where the runtime is built, the engine's backend. Engines are imported lazily, inside these
packages only, so `import toolkit` never pays for (or breaks on) an engine the user did not ask
for.
"""
