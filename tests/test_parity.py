"""Parity: the comparison logic, and real runs showing the check passes and can fail."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import pytest

from toolkit.parity.cases import ENGINES, all_cases, merge, select
from toolkit.parity.harness import Harness, loss_deviation, weight_deviation
from toolkit.spec import TrainSpec


def test_every_case_is_a_valid_spec() -> None:
    cases = all_cases()
    assert len({case.name for case in cases}) == len(cases)
    for case in cases:
        TrainSpec.from_dict(case.spec)


def test_cases_cover_every_engine_recipe_and_both_frameworks() -> None:
    names = [case.name for case in all_cases()]
    for engine in (
        "ddp/",
        "horovod/horovodrun-gloo",
        "horovod/mpirun",
        "horovod-tf/",
        "zero0/",
        "zero1/",
        "zero2/",
        "zero3/",
        "pipeline2/",
        "tf-mirrored/",
        "tf-multiworker/",
    ):
        for recipe in ("adamw", "sgd-accum2-clip-lrscale", "adam-l2-accum4"):
            assert any(n.startswith(engine) and n.endswith(recipe) for n in names), (engine, recipe)
    for offload in ("zero2-offload/", "zero3-offload/"):
        assert any(n.startswith(offload) for n in names)
    assert any("bf16" in n for n in names)
    assert any(n.startswith("cross-framework") for n in names)


def test_deviation_is_relative_to_the_largest_reference_value() -> None:
    reference = {"w": np.array([2.0, -4.0]), "b": np.array([1.0])}
    assert weight_deviation(reference, reference) == 0.0
    moved = {"w": np.array([2.0, -4.04]), "b": np.array([1.0])}
    assert math.isclose(weight_deviation(moved, reference), 0.01, rel_tol=1e-9)
    assert weight_deviation({"w": reference["w"]}, reference) == math.inf
    assert math.isclose(loss_deviation([1.0, 2.02], [1.0, 2.0]), 0.01, rel_tol=1e-9)
    assert loss_deviation([1.0], [1.0, 2.0]) == math.inf


def test_merge_is_deep_and_select_matches_substrings() -> None:
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}
    cases = all_cases()
    assert {c.engine for c in select(cases, ["zero3/"])} == {"zero3/deepspeed"}
    assert select(cases, []) == cases


def only(pattern: str):  # type: ignore[no-untyped-def]
    (case,) = [case for case in all_cases() if case.name == pattern]
    return case


@pytest.mark.multiproc
def test_ddp_matches_the_reference_and_a_one_percent_lr_change_is_caught(tmp_path: Path) -> None:
    case = only("ddp/torchrun:mlp:adamw")
    one_percent_off = {"optimizer": {"lr": case.spec["optimizer"]["lr"] * 1.01}}
    broken = dataclasses.replace(case, reference_spec=one_percent_off)
    good, bad = Harness(tmp_path).run([case, broken])
    assert good.status == "pass", good.error or good.to_json()
    assert good.weight_deviation < 1e-5
    assert bad.status == "fail", bad.error or bad.to_json()
    assert bad.weight_deviation > 100 * case.tolerance


@pytest.mark.multiproc
def test_keras_and_torch_references_agree(tmp_path: Path) -> None:
    (outcome,) = Harness(tmp_path).run([only("cross-framework:mlp:tf-ref-vs-torch-ref")])
    assert outcome.status == "pass", outcome.to_json()


FULL_PARITY = os.environ.get("TOOLKIT_PARITY") == "full"
# By default every engine once, with the recipe that exercises the most (Adam state, warmup and
# cosine decay), DeepSpeed's own scheduler once, and both framework references under the
# schedule; `TOOLKIT_PARITY=full make test` (and `make demo`) run every case.
REPRESENTATIVE = [
    ":mlp:adamw-warmup-cosine",
    "zero1/deepspeed:mlp:sgd-logwarmup-linear",
    "tf-ref-vs-torch-ref:warmup-cosine",
]


@pytest.mark.multiproc
@pytest.mark.timeout(3600)
def test_parity_cases_pass(tmp_path: Path) -> None:
    """The parity suite as `toolkit parity` runs it (a representative subset unless
    TOOLKIT_PARITY=full): every engine within its stated tolerance."""
    cases = all_cases() if FULL_PARITY else select(all_cases(), REPRESENTATIVE)
    assert {case.engine for case in cases} >= set(ENGINES), "the subset skips an engine"
    outcomes = Harness(tmp_path).run(cases)
    failures = {o.case.name: o.error[-600:] or o.to_json() for o in outcomes if o.status != "pass"}
    assert not failures, failures
