"""Output paths checked before any work: a directory to write into, a file to write."""

from __future__ import annotations

from pathlib import Path

from schedsim.errors import InputError


def prepare_out_dir(path, flag: str = "--out") -> Path:
    """Create the output directory ``path`` (and its parents) now, or raise an InputError naming
    ``flag`` and the path: a file of that name, or a directory that cannot be created."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag}: {path}: is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{flag}: {path}: cannot create the directory ({exc.strerror or exc})") from None
    return path


def check_out_file(path, flag: str = "--out", *, create_parent: bool = False) -> Path:
    """Check that the file ``path`` can be written: not a directory, and its directory exists
    (or, with ``create_parent``, can be created now)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{flag}: {path}: is a directory; expected a file name")
    parent = path.parent
    if create_parent:
        prepare_out_dir(parent, flag)
    elif not parent.is_dir():
        what = "is a file, not a directory" if parent.exists() else "does not exist"
        raise InputError(f"{flag}: {path}: directory '{parent}' {what}")
    return path
