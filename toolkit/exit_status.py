"""The exit status a preempted rank ends with: what the rank (toolkit.runtime.preemption), the
supervisor (toolkit.launch.outcome) and a batch script (toolkit.render.slurm) agree on."""

PREEMPTED = 75
"""sysexits' EX_TEMPFAIL, a temporary failure to be retried: every rank saved a checkpoint
before it stopped, and a new launch resumes from it."""
