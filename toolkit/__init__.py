"""toolkit: one training script and one spec file on every established distributed engine."""

__version__ = "0.1.0"
