"""What a step with inf or NaN gradients does, for real, in fp32: DDP applies it (the weights
turn NaN), and so does ZeRO-2 under the toolkit's default, which skips DeepSpeed's gradient
norm (`zero.compute_grad_norm` null resolves to false without clipping). With the norm
DeepSpeed's ZeRO-1/2 find it inf and skip the step, which no other engine does: the weights
stay finite. Both findings are written in toolkit.render.deepspeed's docstring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realrun import BIN, ROOT, run

pytestmark = pytest.mark.multiproc

SCRIPT = str(ROOT / "tests" / "scripts" / "nonfinite_step.py")
BASE = {
    "seed": 3,
    "batch": {"global": 8, "micro": 4},
    "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
}


def weights_stay_finite(spec: dict[str, Any], directory: Path, name: str) -> bool:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**BASE, **spec}))
    done = run([str(BIN / "toolkit"), "launch", "--spec", str(path), "--", SCRIPT, str(path)])
    assert done.returncode == 0, done.explain()
    finite = {report["rank"]: report["finite"] for report in done.reports if "finite" in report}
    assert sorted(finite) == [0, 1] and len(set(finite.values())) == 1, done.explain()
    return finite[0]


def test_zero2_applies_a_nonfinite_step_as_ddp_does_unless_it_computes_the_norm(
    tmp_path: Path,
) -> None:
    zero2 = {"backend": "deepspeed", "launch": {"launcher": "deepspeed", "np": 2}}
    ddp = {"backend": "ddp", "launch": {"launcher": "torchrun", "np": 2}}
    assert not weights_stay_finite(ddp, tmp_path, "ddp")
    assert not weights_stay_finite({**zero2, "zero": {"stage": 2}}, tmp_path, "zero2")
    with_norm = {**zero2, "zero": {"stage": 2, "compute_grad_norm": True}}
    assert weights_stay_finite(with_norm, tmp_path, "zero2-norm")
