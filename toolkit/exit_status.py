"""The exit statuses a rank ends with on purpose: what the rank (toolkit.runtime), the supervisor
(toolkit.launch.outcome) and a batch script (toolkit.render.slurm) agree on."""

SAVE_FAILED = 74
"""sysexits' EX_IOERR: a checkpoint could not be written (disk full, permissions) and the spec
says stop (checkpoint.save_failure); every checkpoint saved before is intact. A restart would
fail the same way, so none is made."""

PREEMPTED = 75
"""sysexits' EX_TEMPFAIL, a temporary failure to be retried: every rank saved a checkpoint
before it stopped, and a new launch resumes from it."""
