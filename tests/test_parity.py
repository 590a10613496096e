"""Parity: the comparison logic, and real runs showing the check passes and can fail."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tests.options import FULL_PARITY
from toolkit.parity.cases import ENGINES, STEPS, TOLERANCE, all_cases, merge, select
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


# By default one case per engine family (DDP, FSDP, FSDP x tensor parallel, Horovod torch and TF,
# ZeRO with the DeepSpeed scheduler, ZeRO-3 with both offloads, the pipeline, MirroredStrategy,
# MultiWorkerMirrored), FSDP against ZeRO-3 directly (accumulation and clipping), with
# the recipe that exercises the most (Adam state, warmup and cosine decay), and both framework
# references under the schedule. Elsewhere in `make test`, ZeRO-2 trains to the reference weights
# across two hosts (tests/cluster) and Horovod's Gloo controller in the engine cells.
# `TOOLKIT_PARITY=full make test` and `make demo` run every case.
REPRESENTATIVE = [
    "ddp/torchrun:mlp:adamw-warmup-cosine",
    "fsdp/torchrun:mlp:sgd-accum2-clip-lrscale",
    "fsdp-tp2/torchrun:mlp:sgd-accum2-clip-lrscale",
    "fsdp-vs-zero3:mlp:sgd-accum2-clip-lrscale",
    "horovod/mpirun:mlp:adamw-warmup-cosine",
    "zero1/deepspeed:mlp:sgd-logwarmup-linear",
    "zero3/deepspeed:mlp:adam-l2-accum4:recompute",
    "zero3-offload/deepspeed:mlp:adamw-warmup-cosine",
    "pipeline2/deepspeed:mlp:adamw-warmup-cosine",
    "horovod-tf/horovodrun-gloo:mlp:adamw-warmup-cosine",
    "tf-mirrored/in-process:mlp:adamw-warmup-cosine",
    "tf-multiworker/local:mlp:adamw-warmup-cosine",
    "tf-ref-vs-torch-ref:warmup-cosine",
]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """One harness for the module: an engine run the two tests share runs once."""
    return Harness(tmp_path_factory.mktemp("parity"))


@pytest.mark.multiproc
def test_a_one_percent_lr_change_is_caught(harness: Harness) -> None:
    """The check can fail: the DDP case against a reference trained at 1% more learning rate
    (the engine run is the one the subset's DDP case compares too)."""
    case = only(REPRESENTATIVE[0])
    one_percent_off = {"optimizer": {"lr": case.spec["optimizer"]["lr"] * 1.01}}
    broken = dataclasses.replace(case, reference_spec=one_percent_off)
    good, bad = harness.run([case, broken])
    assert good.status == "pass", good.error or good.to_json()
    assert good.weight_deviation < 1e-5
    assert bad.status == "fail", bad.error or bad.to_json()
    assert bad.weight_deviation > 100 * case.tolerance


@pytest.mark.multiproc
@pytest.mark.timeout(3600)
def test_parity_cases_pass(harness: Harness) -> None:
    """The parity suite as `toolkit parity` runs it (the subset above unless
    TOOLKIT_PARITY=full): every engine within its stated tolerance."""
    cases = all_cases() if FULL_PARITY else select(all_cases(), REPRESENTATIVE)
    assert {ENGINES[case.engine].name for case in cases if case.engine in ENGINES} == {
        engine.name for engine in ENGINES.values()
    }, "the subset skips an engine"
    assert {case.framework for case in cases} == {"torch", "tensorflow"}
    outcomes = harness.run(cases)
    failures = {o.case.name: o.error[-600:] or o.to_json() for o in outcomes if o.status != "pass"}
    assert not failures, failures


@pytest.mark.multiproc
def test_fp16_compression_changes_the_math_within_its_bound(harness: Harness) -> None:
    """DDP's fp16 hook and DeepSpeed's fp16 reduce are applied (the runs leave the fp32
    tolerance of the uncompressed reference) and end within the stated bound; Horovod's fp16
    agrees with DDP's run against run."""
    ddp, zero2, same_cast = (
        only("ddp/torchrun:mlp:sgd-accum2-clip-lrscale:fp16-compression"),
        only("zero2/deepspeed:mlp:sgd-accum2-clip-lrscale:fp16-compression"),
        only("horovod-vs-ddp:mlp:fp16-compression"),
    )
    compressed, deepspeed, against = harness.run([ddp, zero2, same_cast])
    for outcome in (compressed, deepspeed):  # DeepSpeed's: its communication_data_type
        assert outcome.status == "pass", outcome.error or outcome.to_json()
        assert outcome.weight_deviation > TOLERANCE["fp32"]
    assert against.status == "pass", against.error or against.to_json()


@pytest.mark.multiproc
def test_fp16_engines_skip_the_references_overflowed_steps(harness: Harness) -> None:
    """FSDP (its overflow check all-reduced over the shards), Horovod and MultiWorkerMirrored
    (Keras' LossScaleOptimizer) skip exactly the steps their fp16 reference skips, some but not
    all of them; a reference whose rule spends no hysteresis skips others, and the case fails."""
    fsdp, horovod, keras = (
        only("fsdp/torchrun:mlp:sgd-accum2-clip-lrscale:fp16:overflows"),
        only("horovod/horovodrun-gloo:mlp:sgd-accum2-clip-lrscale:fp16:overflows"),
        only("tf-multiworker/local:mlp:sgd-accum2-clip-lrscale:fp16:overflows"),
    )
    no_hysteresis = dataclasses.replace(fsdp, reference_spec={"loss_scaling": {"hysteresis": 1}})
    sharded, ring, multiworker, broken = harness.run([fsdp, horovod, keras, no_hysteresis])
    for outcome in (sharded, ring, multiworker):
        assert outcome.status == "pass", outcome.error or outcome.to_json()
        assert 0 < len(outcome.skipped) < STEPS
    # Keras' LossScaleOptimizer on the same rule skips what GradScaler does.
    assert multiworker.skipped == sharded.skipped
    assert broken.status == "fail", broken.error or broken.to_json()
    assert broken.skipped != broken.reference_skipped


@pytest.mark.multiproc
def test_local_sgd_steps_alone_and_averages_on_its_period(harness: Harness) -> None:
    """DDP's post-local SGD matches the reference that trains a model per rank and averages
    them every 4 steps; it is not synchronous DDP (it fails against the synchronous
    reference), and a reference averaging every 5 steps fails too."""
    case = only("ddp/torchrun:mlp:sgd-accum2-clip-lrscale:local-sgd")
    synchronous = dataclasses.replace(case, reference_spec={"ddp": {"sync": {"every_steps": 1}}})
    other_period = dataclasses.replace(case, reference_spec={"ddp": {"sync": {"every_steps": 5}}})
    good, sync, period = harness.run([case, synchronous, other_period])
    assert good.status == "pass", good.error or good.to_json()
    for broken in (sync, period):
        assert broken.status == "fail", broken.error or broken.to_json()
        assert broken.weight_deviation > 10 * case.tolerance
