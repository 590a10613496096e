"""Write corpus.txt, the GPT example's training text, from the project's own documentation.

    python hvd_examples/data/make_corpus.py      # from the repository root

The text is the README followed by the module docstring of every module under toolkit/, in
path order, each under a "## path" line: our own words, so no licence question, and plain
English with code in it, which a byte-level model learns visibly within minutes. It is a
snapshot: the committed file stays as it was when written, and rewriting it changes the
example's measured perplexities (hvd_examples/data/README.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "corpus.txt"


def module_docstrings() -> list[str]:
    found = []
    for path in sorted((ROOT / "toolkit").rglob("*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if docstring:
            found.append(f"## {path.relative_to(ROOT).as_posix()}\n\n{docstring}\n")
    return found


def main() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    OUT.write_text("\n".join([readme, *module_docstrings()]), encoding="utf-8")
    print(f"{OUT}: {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
