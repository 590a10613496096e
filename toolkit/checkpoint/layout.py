"""Names inside a checkpoint directory, and the durable file operations saves are made of.

    DIR/latest                      "step-000200": the newest complete checkpoint
    DIR/step-000200/                committed: manifest.json, manifest.json.sha256, *.safetensors
    DIR/.incomplete-step-000300/    a save in progress, or the leftover of one that was killed
    DIR/.old-step-000100-<random>/  a checkpoint being deleted or replaced
    DIR/.latest.<pid>.tmp           a pointer being written

Everything starting with `.incomplete-`, `.old-` or `.latest.` is a leftover once no save is
running, and the next save removes it. Files and directories are created with the default
modes, so the umask decides who may read them.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from toolkit.errors import ToolkitError

MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.json.sha256"
LATEST = "latest"
_STEP = re.compile(r"step-(\d{6,})")
_LEFTOVER_PREFIXES = (".incomplete-", ".old-", ".latest.")
_MAX_POINTER_BYTES = 256


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def parse_step(name: str) -> int | None:
    match = _STEP.fullmatch(name)
    return int(match.group(1)) if match else None


def staging_dir(root: Path, step: int) -> Path:
    return root / f".incomplete-{step_name(step)}"


def fsync_dir(path: Path) -> None:
    """Make renames and creations inside `path` durable."""
    handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def write_durably(path: Path, data: bytes) -> None:
    """Write `path` so that it holds either its old content or all of `data`, never a mix."""
    temporary = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def committed(root: Path) -> dict[int, Path]:
    """Committed checkpoint directories under `root` by step (complete or not: see `complete`)."""
    if not root.is_dir():
        return {}
    found = {}
    for entry in root.iterdir():
        step = parse_step(entry.name)
        if step is not None and entry.is_dir():
            found[step] = entry
    return found


def complete(path: Path) -> bool:
    """A committed directory holds its manifest; a damaged one may not."""
    return (path / MANIFEST).is_file() and (path / MANIFEST_SUM).is_file()


def read_pointer(root: Path) -> str | None:
    """The directory name `root/latest` holds; None when there is no pointer."""
    pointer = root / LATEST
    try:
        with open(pointer, "rb") as stream:
            raw = stream.read(_MAX_POINTER_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ToolkitError(f"{pointer}: cannot be read ({error.strerror or error})") from None
    text = raw.decode("ascii", errors="replace").strip()
    if len(raw) > _MAX_POINTER_BYTES or parse_step(text) is None:
        raise ToolkitError(
            f"{pointer}: is not a checkpoint pointer (expected a name like step-000123)",
            f"delete it, or write the name of a directory in {root} into it",
        )
    return text


def write_pointer(root: Path, name: str) -> None:
    write_durably(root / LATEST, f"{name}\n".encode())


def remove_pointer(root: Path) -> None:
    (root / LATEST).unlink(missing_ok=True)
    fsync_dir(root)


def discard(path: Path) -> None:
    """Delete a directory: first renamed out of the committed names (atomic), then removed."""
    doomed = path.parent / f".old-{path.name}-{uuid.uuid4().hex[:12]}"
    os.rename(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_leftovers(root: Path, *, sparing: Path | None = None) -> None:
    """Remove what interrupted saves left in `root`, except `sparing` (the save in progress)."""
    for entry in root.iterdir():
        if not entry.name.startswith(_LEFTOVER_PREFIXES) or entry == sparing:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
