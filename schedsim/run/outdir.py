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


RUN_FILES = ("summary.json", "requests.csv", "requests.parquet", "steps.csv", "steps.parquet", "latency_cdf.png", "batch_size_hist.png",
             "queue_length.png", "timeline.png", "batches.csv", "live.json", "live_steps.csv",
             "validation.json", "latency_cdf_validation.png")
"""What a run (or a live run, or its validation) writes into its directory."""


_CLAIMED_NEW: list[Path] = []
"""Directories :func:`claim_run_dir` created in this process, deepest first."""


def claim_run_dir(path, overwrite: bool = False, flag: str = "--out") -> Path:
    """Make ``path`` the run's own directory: created now; refused when it holds anything unless
    ``overwrite``, which removes an earlier run's files (and keeps any others) so that none of
    them can pass for this run's. A command that then fails takes back what it created
    (:func:`settle_claimed_dirs`)."""
    new = [p for p in (Path(path), *Path(path).parents) if not p.exists()]
    path = prepare_out_dir(path, flag)
    _CLAIMED_NEW.extend(new)
    entries = sorted(p.name for p in path.iterdir())
    if entries and not overwrite:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise InputError(f"{flag}: {path} is not empty ({len(entries)} entries: {shown}); "
                         "give an empty or new directory, or --overwrite to replace the run in it")
    if overwrite:
        for name in RUN_FILES:
            try:
                (path / name).unlink(missing_ok=True)
            except OSError as exc:
                raise InputError(f"{flag}: {path / name}: cannot remove it ({exc.strerror or exc})") from None
    return path


def settle_claimed_dirs(failed: bool) -> None:
    """At a command's end: when it ``failed`` (bad input found after its --out was claimed),
    remove the directories :func:`claim_run_dir` created that are still empty, so that it
    leaves no trace of a run behind; either way, forget them."""
    while _CLAIMED_NEW:
        created = _CLAIMED_NEW.pop(0)
        if failed:
            try:
                created.rmdir()
            except OSError:  # written into, or gone: either way not ours to remove
                pass


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
