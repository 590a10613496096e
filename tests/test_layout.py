"""The one parallel layout (`parallel:`): degrees that multiply to the world size, FSDP's
replicate x shard, the engines that run each degree, and the earlier spellings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolkit.cli import main
from toolkit.spec import SpecError, TrainSpec
from toolkit.spec.layout import Layout, resolve_layout
from toolkit.spec.sections import ParallelSpec


def _one_line(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as caught:
        TrainSpec.from_dict(data)
    return caught.value.one_line()


@pytest.mark.parametrize(
    ("parallel", "world", "expected"),
    [
        ({}, 4, Layout(world=4, data=4, pipeline=1, tensor=1, replicate=1, shard=4)),
        ({"tensor": 2}, 4, Layout(world=4, data=2, pipeline=1, tensor=2, replicate=1, shard=2)),
        ({"pipeline": 2}, 8, Layout(world=8, data=4, pipeline=2, tensor=1, replicate=1, shard=4)),
        (
            {"replicate": 2, "shard": 4, "data": 8},
            8,
            Layout(world=8, data=8, pipeline=1, tensor=1, replicate=2, shard=4),
        ),
    ],
)
def test_the_unwritten_degrees_are_derived(
    parallel: dict[str, int], world: int, expected: Layout
) -> None:
    assert resolve_layout(ParallelSpec(**parallel), world) == expected


@pytest.mark.parametrize(
    ("parallel", "world", "path"),
    [
        ({"tensor": 3}, 4, "parallel.tensor"),
        ({"pipeline": 3}, 4, "parallel.pipeline"),
        ({"data": 2}, 4, "parallel.data"),
        ({"replicate": 3}, 4, "parallel.replicate"),
        ({"replicate": 2, "shard": 4}, 4, "parallel.shard"),
    ],
)
def test_a_layout_that_does_not_multiply_out_names_its_field(
    parallel: dict[str, int], world: int, path: str
) -> None:
    with pytest.raises(SpecError) as caught:
        resolve_layout(ParallelSpec(**parallel), world)
    assert [issue.path for issue in caught.value.issues] == [path]


def test_spec_check_and_the_ranks_refuse_the_same_layout() -> None:
    written = {"backend": "fsdp", "parallel": {"data": 3}}
    at_check = _one_line({**written, "launch": {"np": 4}})
    with pytest.raises(SpecError) as at_start:
        TrainSpec.from_dict(written).layout_for(4)
    assert at_check == at_start.value.one_line()
    assert at_check == (
        "spec error: parallel.data=3: must be the world size (4) / (pipeline(1) x tensor(1)) = 4 "
        "HINT: leave parallel.data out to derive it, or change launch.np"
    )


def test_shard_and_replicate_must_multiply_to_a_written_data_degree() -> None:
    line = _one_line({"backend": "fsdp", "parallel": {"data": 4, "replicate": 2, "shard": 3}})
    assert "parallel.shard=3: replicate(2) x shard must equal data(4)" in line


@pytest.mark.parametrize(
    ("backend", "parallel", "says"),
    [
        ("ddp", {"pipeline": 2}, "pipeline parallelism runs with backend deepspeed"),
        ("deepspeed", {"tensor": 2}, "tensor parallelism runs with backend fsdp"),
        ("horovod", {"replicate": 2}, "hybrid sharding runs with backend fsdp"),
    ],
)
def test_each_degree_needs_an_engine_that_runs_it(
    backend: str, parallel: dict[str, int], says: str
) -> None:
    assert says in _one_line({"backend": backend, "parallel": parallel})


def test_the_pipeline_engine_limit_is_named() -> None:
    line = _one_line({"backend": "deepspeed", "zero": {"stage": 2}, "parallel": {"pipeline": 2}})
    assert "zero.stage=2: the pipeline engine runs ZeRO stages 0 to 1 only" in line


def test_pipeline_stages_is_read_as_the_earlier_spelling_of_parallel_pipeline() -> None:
    spec = TrainSpec.from_dict({"backend": "deepspeed", "pipeline": {"stages": 2}})
    assert spec.parallel.pipeline == 2 and spec.layout_for(4).data == 2
    assert TrainSpec.from_dict(spec.to_dict()) == spec
    agreeing = {"backend": "deepspeed", "pipeline": {"stages": 2}, "parallel": {"pipeline": 2}}
    assert TrainSpec.from_dict(agreeing).parallel.pipeline == 2
    line = _one_line({**agreeing, "parallel": {"pipeline": 1}})
    assert line.startswith("spec error: pipeline.stages=2: must equal parallel.pipeline (1)")


def test_fsdp_replicate_says_where_it_moved() -> None:
    line = _one_line({"backend": "fsdp", "fsdp": {"replicate": 2}})
    assert line == (
        "spec error: fsdp.replicate=2: moved to parallel.replicate: the layout of the ranks "
        "lives in parallel HINT: write parallel.replicate"
    )


def test_the_layout_describes_itself_in_the_batch_errors() -> None:
    data = {"backend": "fsdp", "batch": {"global": 6}, "parallel": {"tensor": 2}}
    line = _one_line({**data, "launch": {"np": 8}})
    assert "(world size 8: data 4 x tensor 2)" in line


def test_launch_dry_run_shows_the_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tp.yaml"
    path.write_text(
        "backend: fsdp\nbatch: {global: 8}\nparallel: {tensor: 2}\n"
        "launch: {launcher: torchrun, np: 4}\n"
    )
    assert main(["launch", "--spec", str(path), "--dry-run", "--", "t.py"]) == 0
    assert "layout: data 2 x tensor 2" in capsys.readouterr().out.splitlines()
    assert main(["launch", "--spec", str(path), "--dry-run", "--json", "--", "t.py"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"] == "data 2 x tensor 2"
