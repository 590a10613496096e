"""The runtime API: `init(spec)` returns a `Run` over whichever engine the spec names."""

from toolkit.runtime.evaluation import Metrics
from toolkit.runtime.run import Run, init

__all__ = ["Metrics", "Run", "init"]
