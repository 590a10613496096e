"""BENCHMARKS.md states the step figures once: its table is the committed report that
`toolkit bench step --all --out docs/bench` wrote (docs/bench/step.md), pasted verbatim after
the page's marker, and that report's JSON holds the same cases."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- bench-step-table -->\n"


def test_benchmarks_page_shows_the_committed_step_report() -> None:
    page = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    report = (ROOT / "docs" / "bench" / "step.md").read_text(encoding="utf-8")
    assert MARKER in page
    assert page.split(MARKER, 1)[1].startswith("\n" + report), (
        "paste docs/bench/step.md after the marker in BENCHMARKS.md"
    )
    cases = json.loads((ROOT / "docs" / "bench" / "step.json").read_text())["cases"]
    for case in cases:
        assert f"| {case['name']} |" in report, case["name"]
