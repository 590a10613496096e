"""Run parity cases in real processes through their real launchers and compare with references.

Each case's spec is written to a file, its launch plan rendered exactly as `toolkit launch` would
and started under the supervisor; the single-process reference of the same framework, global
batch, optimizer and learning rate runs once per distinct setting and is reused, and so is an
engine run that two cases share (cases that differ only in their reference, as the one that
proves the check can fail). No engine is imported here: engines run only inside the launched
workers.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.launch.runner import execute, launch_plan_here
from toolkit.launch.supervisor import run_launcher
from toolkit.parity.architectures import held_out_scores
from toolkit.parity.cases import HELD_OUT_MARGIN, STEPS, Case, merge
from toolkit.ports import free_port, free_port_range
from toolkit.spec import TrainSpec

WORKER = str(Path(__file__).with_name("worker.py"))
# A case takes 5-15 s; a hung one must not eat the rest of a CI run.
CASE_TIMEOUT_S = 240


def reference_key(framework: str, arch: str, steps: int, spec: TrainSpec) -> str:
    """What makes two cases' single-process references the same run."""
    settings = spec.to_dict()
    return json.dumps(
        {
            "framework": framework,
            "arch": arch,
            "steps": steps,
            "seed": spec.seed,
            "global": spec.batch_for().global_,
            "optimizer": settings["optimizer"],
            "schedule": settings["schedule"],
            "lr": spec.effective_lr(),
            "clip": spec.clip_grad_norm,
            "precision": spec.precision,
            # fp16's and local SGD's references are cut as the engine's ranks cut each step
            # (worker docs).
            **(
                {
                    "loss_scaling": settings["loss_scaling"],
                    "sync": settings["ddp"]["sync"],
                    "batch": settings["batch"],
                    "ranks": spec.world_size,
                }
                if spec.precision == "fp16" or spec.ddp.sync.local
                else {}
            ),
        },
        sort_keys=True,
    )


@dataclass
class Outcome:
    case: Case
    status: str  # "pass" | "fail" | "error"
    weight_deviation: float = float("nan")
    loss_deviation: float = float("nan")
    losses: list[float] = field(default_factory=list)
    reference_losses: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    reference_skipped: list[int] = field(default_factory=list)
    held_out_loss: float = float("nan")
    """Cross-entropy of the run's final weights on the digits test split."""
    reference_held_out_loss: float = float("nan")
    accuracy: float = float("nan")
    """Held-out accuracy of the run's final weights."""
    reference_accuracy: float = float("nan")
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "engine": self.case.engine,
            "launcher": self.case.launcher,
            "arch": self.case.arch,
            "precision": self.case.precision,
            "tolerance": self.case.tolerance,
            "status": self.status,
            "max_weight_deviation": self.weight_deviation,
            "max_loss_deviation": self.loss_deviation,
            "losses": self.losses,
            "reference_losses": self.reference_losses,
            "skipped_steps": self.skipped,
            "reference_skipped_steps": self.reference_skipped,
            "held_out_loss": self.held_out_loss,
            "reference_held_out_loss": self.reference_held_out_loss,
            "held_out_accuracy": self.accuracy,
            "reference_held_out_accuracy": self.reference_accuracy,
            "error": self.error,
        }


@dataclass(frozen=True)
class RunFiles:
    losses: list[float]
    weights: dict[str, np.ndarray]
    skipped: list[int]
    """The steps fp16 skipped for overflowed gradients."""


def read_run(directory: Path) -> RunFiles:
    with np.load(directory / "weights.npz", allow_pickle=False) as archive:
        weights = {name: archive[name] for name in archive.files}
    return RunFiles(
        json.loads((directory / "losses.json").read_text()),
        weights,
        json.loads((directory / "skipped.json").read_text()),
    )


def weight_deviation(weights: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """Worst tensor's max |w - w_ref| / max |w_ref|; inf when the names differ."""
    if set(weights) != set(reference):
        return float("inf")
    return max(
        float(np.abs(weights[name] - reference[name]).max() / np.abs(reference[name]).max())
        for name in reference
    )


def loss_deviation(losses: list[float], reference: list[float]) -> float:
    if len(losses) != len(reference):
        return float("inf")
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


class Harness:
    def __init__(self, work_dir: Path, *, steps: int = STEPS) -> None:
        self.work_dir = work_dir
        self.steps = steps
        self.references: dict[str, Path] = {}
        self.engine_runs: dict[str, Path] = {}
        self._launches = itertools.count()
        """Numbers every launch's directory, failed ones included: a launch after a failed one
        never writes into, or reads, the failed one's files."""

    def _worker_args(self, spec_file: Path, arch: str, out: Path) -> list[str]:
        return [
            WORKER,
            "--spec",
            str(spec_file),
            "--arch",
            arch,
            "--steps",
            str(self.steps),
            "--out",
            str(out),
        ]

    def _write_spec(self, data: dict[str, Any], path: Path) -> TrainSpec:
        spec = TrainSpec.from_dict(data)  # a bad case is a SpecError before anything starts
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        return spec

    def reference(self, framework: str, arch: str, data: dict[str, Any]) -> RunFiles:
        """The single-process reference for this setting, run once and reused.

        The key holds every spec setting the reference's math reads; a setting left out makes
        a later case compare against an earlier case's reference (the schedule once was: the
        warmup-cosine cases then "failed" by 0.31 whenever a constant-rate case ran first)."""
        key = reference_key(framework, arch, self.steps, TrainSpec.from_dict(data))
        if key not in self.references:
            name = f"ref{next(self._launches):02d}-{framework}-{arch}"
            directory = self.work_dir / "references" / name
            spec_file = directory / "spec.json"
            self._write_spec(data, spec_file)
            argv = [
                sys.executable,
                *self._worker_args(spec_file, arch, directory),
                "--reference",
                framework,
                "--ranks",
                str(TrainSpec.from_dict(data).world_size),
            ]
            result = run_launcher(argv, timeout=CASE_TIMEOUT_S, echo=False)
            if not result.ok:
                raise RuntimeError(f"reference {framework}/{arch} failed: {result.report()}")
            self.references[key] = directory
        return read_run(self.references[key])

    def run_case(self, case: Case) -> Outcome:
        try:
            if case.against is not None:
                reference = self._engine_run(case.against, case.arch)
                run = self._engine_run(case.spec, case.arch)
            else:
                reference_data = merge(case.spec, case.reference_spec)
                reference = self.reference(case.reference_framework, case.arch, reference_data)
                if case.compare_to:
                    run = self.reference(case.compare_to, case.arch, reference_data)
                else:
                    run = self._engine_run(case.spec, case.arch)
        except RuntimeError as error:
            return Outcome(case, "error", error=str(error))
        outcome = Outcome(
            case,
            "fail",
            weight_deviation=weight_deviation(run.weights, reference.weights),
            loss_deviation=loss_deviation(run.losses, reference.losses),
            losses=run.losses,
            reference_losses=reference.losses,
            skipped=run.skipped,
            reference_skipped=reference.skipped,
        )
        outcome.held_out_loss, outcome.accuracy = held_out_scores(case.arch, run.weights)
        scores = held_out_scores(case.arch, reference.weights)
        outcome.reference_held_out_loss, outcome.reference_accuracy = scores
        tolerance = case.tolerance
        close = outcome.weight_deviation <= tolerance and outcome.loss_deviation <= tolerance
        # A lossy method must also do nearly as well on held-out data as the exact run.
        accurate = case.bound is None or outcome.held_out_loss <= (
            outcome.reference_held_out_loss * (1 + HELD_OUT_MARGIN)
        )
        if close and accurate and run.skipped == reference.skipped:
            outcome.status = "pass"
        return outcome

    def _engine_run(self, data: dict[str, Any], arch: str) -> RunFiles:
        """An engine's run of spec `data`, launched once and reused by every case naming it."""
        key = json.dumps([data, arch, self.steps], sort_keys=True)
        if key not in self.engine_runs:
            directory = self.work_dir / f"case{next(self._launches):02d}"
            self.engine_runs[key] = self._launch_engine(data, arch, directory)
        return read_run(self.engine_runs[key])

    def _launch_engine(self, data: dict[str, Any], arch: str, directory: Path) -> Path:
        spec_file = directory / "spec.json"
        # Fresh ports per case: back-to-back jobs on fixed ports can meet a socket of the last.
        ranks = TrainSpec.from_dict(data).world_size
        ports = {"launch": {"master_port": free_port()}, "tf": {"port": free_port_range(ranks)}}
        spec = self._write_spec(merge(data, ports), spec_file)
        out = directory / "run"
        plan = launch_plan_here(spec, self._worker_args(spec_file, arch, out))
        result = execute(plan, spec, timeout=CASE_TIMEOUT_S, echo=False)
        if not result.ok:
            raise RuntimeError(result.report())
        return out

    def run(
        self, cases: list[Case], on_done: Callable[[Outcome], None] | None = None
    ) -> list[Outcome]:
        outcomes = []
        for case in cases:
            outcome = self.run_case(case)
            outcomes.append(outcome)
            if on_done:
                on_done(outcome)
        return outcomes
