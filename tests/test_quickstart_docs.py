"""The README's quickstart is the files it names, byte for byte, and the README stays short.

A code block in README.md that shows a file is preceded by a marker line naming the file,
`<!-- quickstart:hvd_examples/quickstart.py -->`, then a fenced block (```yaml or ```python)
whose body must equal that file. The last test runs the README's launch command for real.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realrun import rank_env

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 280
QUICKSTART_FILES = ("hvd_examples/quickstart.yaml", "hvd_examples/quickstart.py")
LAUNCH = "toolkit launch --spec hvd_examples/quickstart.yaml -- hvd_examples/quickstart.py"

# The marker, the opening fence on the next line, the body, the closing fence on a line alone.
BLOCK = re.compile(
    r"^<!-- quickstart:(?P<path>[^ >]+) -->\n```(?P<lang>[a-z]+)\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


def readme_text() -> str:
    return README.read_bytes().decode("utf-8")


def shown_files() -> dict[str, str]:
    found: dict[str, str] = {}
    for match in BLOCK.finditer(readme_text()):
        path = match["path"]
        assert path not in found, f"README.md shows {path} twice"
        found[path] = match["body"]
    return found


def test_readme_shows_each_quickstart_file_verbatim() -> None:
    shown = shown_files()
    assert sorted(shown) == sorted(QUICKSTART_FILES), (
        f"README.md marks {sorted(shown)}; expected {sorted(QUICKSTART_FILES)}"
    )
    for path, body in shown.items():
        on_disk = (ROOT / path).read_bytes().decode("utf-8")
        assert body == on_disk, f"README.md's block for {path} differs from the file"


def test_quickstart_blocks_are_marked_with_their_language() -> None:
    languages = {match["path"]: match["lang"] for match in BLOCK.finditer(readme_text())}
    assert languages == {
        "hvd_examples/quickstart.yaml": "yaml",
        "hvd_examples/quickstart.py": "python",
    }


def test_readme_gives_the_quickstart_launch_command() -> None:
    assert LAUNCH in readme_text()


def test_readme_is_at_most_280_lines() -> None:
    lines = len(readme_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines; the limit is {MAX_README_LINES}"
    )


@pytest.mark.multiproc
def test_the_quickstart_trains_under_toolkit_launch_as_written(no_orphans: None) -> None:
    """The README's command, run in the repository as a user would after install: 2 real
    ranks under `toolkit launch`, to the accuracy the digits MLP reaches."""
    assert LAUNCH in readme_text()
    argv = shlex.split(LAUNCH)
    result = subprocess.run(
        [str(Path(sys.executable).parent / argv[0]), *argv[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=rank_env(),
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    found = re.search(r"held-out loss [0-9.]+, accuracy ([0-9.]+)", result.stdout)
    assert found, result.stdout[-2000:]
    assert float(found[1]) >= 0.9, found[0]
