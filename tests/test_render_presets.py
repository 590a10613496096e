"""ds_configs/ holds exactly what `toolkit config presets --write ds_configs/` generates."""

from __future__ import annotations

import shutil
from pathlib import Path

from toolkit.render.presets import render_presets, stale_presets, write_presets

DS_CONFIGS = Path(__file__).resolve().parents[1] / "ds_configs"
REQUIRED = {
    "zero0",
    "zero1",
    "zero2",
    "zero3",
    "zero2_offload",
    "zero3_offload",
    "bf16",
    "pipeline",
}


def test_every_required_preset_exists() -> None:
    assert {name.removesuffix(".json") for name in render_presets(DS_CONFIGS)} >= REQUIRED


def test_ds_configs_match_what_the_command_generates() -> None:
    stale = stale_presets(DS_CONFIGS)
    assert stale == [], f"regenerate with: toolkit config presets --write ds_configs/ ({stale})"


def test_write_then_check_round_trip(tmp_path: Path) -> None:
    shutil.copytree(DS_CONFIGS / "specs", tmp_path / "specs")
    assert set(stale_presets(tmp_path)) == set(render_presets(tmp_path))
    write_presets(tmp_path)
    assert stale_presets(tmp_path) == []
    (tmp_path / "zero1.json").write_text("{}\n")
    (tmp_path / "orphan.json").write_text("{}\n")
    assert stale_presets(tmp_path) == ["orphan.json", "zero1.json"]
