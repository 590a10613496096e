"""`toolkit doctor`: the compatibility pre-flight for the engine stack.

Each engine is probed in its own interpreter (see `probe_protocol`), two at a time, and every
launcher the toolkit drives is looked up next to the interpreter first, then on PATH. The GPUs
come from nvidia-smi (`toolkit.gpu_facts`) and each engine's GPU side from its probe.
"""

from toolkit.doctor.checks import ENGINES, DoctorReport, run_doctor

__all__ = ["ENGINES", "DoctorReport", "run_doctor"]
