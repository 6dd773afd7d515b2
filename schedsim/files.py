"""Writing files so that a crash never leaves one half-written under its real name."""

from __future__ import annotations

import json
import math
import os
import re
from contextlib import contextmanager
from pathlib import Path

import numpy as np


@contextmanager
def replaced_atomically(path: str | os.PathLike):
    """Yield a temporary path next to ``path``; on success it replaces ``path``, else it is removed."""
    import tempfile  # lazy: 0.5-0.9 ms of a run's start-up (-X importtime), and a run without --out writes nothing

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; a plain open() would honour the umask
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    # Reading the umask means setting it; put it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path: str | os.PathLike, write) -> Path:
    """Call ``write(tmp)`` on a temporary path next to ``path``, then rename it into place."""
    with replaced_atomically(path) as tmp:
        write(tmp)
    return Path(path)


def json_safe(value):
    """``value`` with numpy scalars as Python numbers and NaN/inf as null, for strict JSON."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_columns_csv(path: str | os.PathLike, columns: dict, names) -> None:
    """A CSV of ``columns[name]`` for each of ``names``, one row per index, written atomically.

    Floats keep every digit (``repr``) and NaN/inf are empty cells; numpy scalars are
    written as the Python numbers they hold."""
    import csv

    with replaced_atomically(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        for row in zip(*(columns[c] for c in names)):
            w.writerow([_csv_cell(v) for v in row])


def _csv_cell(v) -> str:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    return str(v)


_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def sorted_keys(value):
    """``value`` with every dict's keys in order: names alphabetically, numbers (such as a batch
    size histogram's ``"2"``, ``"10"``) by value, so ``json.dumps`` keeps that order."""
    if isinstance(value, dict):
        def key(k):
            k = str(k)
            if _NUMBER.fullmatch(k):
                return (0, float(k), k)
            return (1, 0.0, k)
        return {k: sorted_keys(value[k]) for k in sorted(value, key=key)}
    if isinstance(value, list):
        return [sorted_keys(v) for v in value]
    return value


def write_json(path: str | os.PathLike, obj) -> None:
    """``obj`` as sorted (:func:`sorted_keys`), indented JSON, written atomically."""
    with replaced_atomically(path) as tmp:
        tmp.write_text(json.dumps(sorted_keys(json_safe(obj)), indent=2, default=str) + "\n")
