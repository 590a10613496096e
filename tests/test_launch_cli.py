"""`toolkit launch` options: durations that cannot work are one line and exit 2 before anything
starts, and --help states the exit-status convention."""

from __future__ import annotations

import pytest

from toolkit.cli import main


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "abc", "1e400", ""])
def test_timeout_must_be_a_positive_finite_number(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["launch", "--spec", "/nonexistent.yaml", f"--timeout={value}", "--", "t.py"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1, err
    assert err.startswith(f"toolkit: error: --timeout={value!r}: must be a positive finite")
    assert "HINT:" in err


@pytest.mark.parametrize("value", ["1", "2", "nan"])
def test_stall_timeout_must_outlast_two_heartbeats(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["launch", "--spec", "/nonexistent.yaml", f"--stall-timeout={value}", "--", "t"])
    err = capsys.readouterr().err
    assert status == 2
    assert f"--stall-timeout={value!r}: must be more than 2 seconds" in err


def test_help_states_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    out = capsys.readouterr().out
    for line in (
        "124    --timeout passed, or a rank stalled",
        "128+N  a rank",
        "130    interrupted",
    ):
        assert line in out
    assert "--stall-timeout SECONDS" in out
