"""run.allreduce, run.broadcast and run.barrier under each engine, both frameworks, 2 ranks."""

from __future__ import annotations

import pytest

from tests.realrun import BIN, PYTHON, ROOT, mpirun, run, spec

pytestmark = pytest.mark.multiproc

SCRIPT = str(ROOT / "tests" / "scripts" / "collectives.py")
HOROVODRUN = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PYTHON]

CELLS = {
    "ddp-torchrun": [str(BIN / "torchrun"), "--nproc_per_node", "2", SCRIPT, spec("ddp")],
    "horovod_torch-horovodrun": [*HOROVODRUN, SCRIPT, spec("horovod")],
    "deepspeed-deepspeed": [str(BIN / "deepspeed"), "--num_gpus", "2", SCRIPT, spec("zero3")],
    "tf_multiworker-mpirun": [*mpirun(), PYTHON, SCRIPT, spec("tf_multiworker")],
    "horovod_tf-horovodrun": [*HOROVODRUN, SCRIPT, spec("horovod_tf")],
}


@pytest.mark.parametrize("cell", list(CELLS))
def test_collectives_agree_on_every_rank(cell: str) -> None:
    result = run(CELLS[cell], timeout=240)
    assert result.returncode == 0, result.explain()
    reports = sorted((r for r in result.reports if "broadcast" in r), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1], result.explain()
    for report in reports:
        assert report["sum"] == 3.0 and report["mean"] == 1.5, report
        assert report["broadcast"] == 17.0, report
