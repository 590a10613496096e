"""Native reference scripts, one per engine, written the way each engine's own docs write them.

They run as files under a real launcher (`python ddp.py ...`) and import only the engine,
numpy and their siblings here (`_bench` for arguments, data, timing and the result file;
`_torch_model` / `_keras_model` for the MLP). The toolkit's own rank program
(`ranks/toolkit_step.py`) imports the same three siblings, so both sides time the same model
on the same data with the same clock.
"""
