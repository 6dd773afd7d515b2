"""Measured cost tables: a CSV of per-cell latency statistics, a JSON provenance sidecar
and, optionally, every raw timed sample.

``NAME.csv`` has one row per cell (one batch size, or one batch size x seq_len).
Required columns: ``batch``, ``latency_ms_mean``, ``latency_ms_p50``, ``latency_ms_p90``,
``latency_ms_p99``, ``latency_ms_std``, ``n``. Optional: ``seq_len`` (then every
batch x seq_len combination must be present), ``latency_ms_min``, ``latency_ms_max``,
``gpu_ms_mean``. Other columns are kept as read and otherwise ignored.

``NAME.json`` (optional) is the provenance written by the measurement script
(``schema`` = ``schedsim.profile/1``, model, backend, device, ..., optionally
``dispatch_overhead_us``, ``dispatch_overhead_us_per_sample`` (added per sample beyond the
first) and ``samples``, the raw-sample file relative to the CSV).

``NAME.samples.npz`` (optional) holds ``batch`` (int32), ``seq_len`` (int32, 0 when the
profile has no seq_len) and ``latency_ms`` (float32), one entry per timed sample. It is
read when the sidecar names it, or, when there is no sidecar, if it exists next to the CSV.

This module only reads, validates and writes; :mod:`schedsim.cost.model` turns a profile into
service times.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from schedsim.files import replaced_atomically
from schedsim.errors import InputError, where

if TYPE_CHECKING:
    import pandas as pd

# pandas costs about 0.35 s to import and `schedsim run` never needs it: profiles are
# parsed with the csv module and validated with numpy; pandas is imported only to build
# ``Profile.table`` on first access, in ``from_frame`` and in ``save_profile``.

SCHEMA = "schedsim.profile/1"

REQUIRED = ("batch", "latency_ms_mean", "latency_ms_p50", "latency_ms_p90",
            "latency_ms_p99", "latency_ms_std", "n")
OPTIONAL = ("seq_len", "latency_ms_min", "latency_ms_max", "gpu_ms_mean")
INTEGER = ("batch", "seq_len", "n")
_LATENCY = ("latency_ms_mean", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99",
            "latency_ms_min", "latency_ms_max")

DEFAULT_PROFILE = "bert-base-fp16-cg-h200.csv"


@dataclass(frozen=True, eq=False)
class Profile:
    """A validated cost table. Build one with :func:`load_profile` or :meth:`from_frame`."""

    columns: dict
    """Column name -> read-only numpy array, one entry per cell, sorted by (seq_len, batch), latencies in ms;
    ``batch``, ``seq_len`` and ``n`` are int64, the other known columns float64, unknown ones as read;
    ``seq_len`` is 0 in every row when the profile has none."""
    meta: dict
    """Provenance from the JSON sidecar; empty when there is none."""
    samples: dict | None = None
    """(batch, seq_len) -> sorted float64 ms array of raw samples, one entry per cell; None when there are none."""
    path: Path | None = None
    """The CSV this profile was read from; None when built in memory."""

    @property
    def source(self) -> str:
        """How messages name this profile."""
        return str(self.path) if self.path is not None else "<memory>"

    @cached_property
    def table(self) -> "pd.DataFrame":
        """:attr:`columns` as a pandas DataFrame (built, and pandas imported, on first access)."""
        import pandas as pd  # lazy: pandas costs about 0.35 s of start-up

        return pd.DataFrame({name: values for name, values in self.columns.items()})

    @property
    def has_seq_len(self) -> bool:
        """Whether latency depends on sequence length (the CSV had a seq_len column)."""
        return bool((self.columns["seq_len"] > 0).any())

    @property
    def batches(self) -> np.ndarray:
        """Measured batch sizes, ascending (int64)."""
        return _ascending(self.columns["batch"])

    @property
    def seq_lens(self) -> np.ndarray:
        """Measured seq_lens, ascending (int64); ``[0]`` when the profile has none."""
        return _ascending(self.columns["seq_len"])

    def column(self, name: str) -> np.ndarray:
        """Column ``name`` as a (n_seq_lens, n_batches) float64 grid, rows by seq_len."""
        nb, ns = len(self.batches), len(self.seq_lens)
        return np.asarray(self.columns[name], dtype=np.float64).reshape(ns, nb)

    @classmethod
    def from_frame(cls, df: "pd.DataFrame", meta: dict | None = None, samples=None,
                   path: str | os.PathLike | None = None) -> "Profile":
        """Validate an in-memory table (same rules as a file; rows are named ``row i``)."""
        import pandas as pd  # lazy: pandas costs about 0.35 s of start-up

        data = {}
        for name in df.columns:
            s = df[name]
            if str(name).strip() not in REQUIRED + OPTIONAL:
                data[name] = (s.to_numpy(), None)  # travels along as is
            elif pd.api.types.is_bool_dtype(s) or pd.api.types.is_numeric_dtype(s):
                # object values keep pd.NA as itself for messages; to_numpy() would make it NaN
                data[name] = (s.to_numpy(object), s.to_numpy(np.float64, na_value=np.nan))
            else:
                data[name] = (s.to_numpy(object), None)  # parsed as text, like a file's fields
        return cls._from_columns(data, meta, samples, path)

    @classmethod
    def _from_columns(cls, data: dict, meta: dict | None, samples, path) -> "Profile":
        """Validate columns given as name -> (values, float64 values or None to parse them as text)."""
        src = str(path) if path is not None else "<memory>"
        if "seq_len" in data and (_numbers(*data["seq_len"]) == 0).all():
            data = {k: v for k, v in data.items() if k != "seq_len"}  # a Profile's own: 0 means "none"
        columns = _validate_table(data, src, lines=None)
        meta = _validate_meta(dict(meta or {}), src)
        if samples is not None:
            samples = _validate_samples(_samples_to_arrays(samples), columns, src)
        return cls(columns, meta, samples, Path(path) if path is not None else None)


def default_profile_path() -> Path:
    """The bundled default profile (the file may not exist yet)."""
    return Path(__file__).resolve().parents[2] / "profiles" / DEFAULT_PROFILE


def sidecar_path(csv_path: str | os.PathLike) -> Path:
    """``NAME.json`` next to ``NAME.csv``."""
    return Path(csv_path).with_suffix(".json")


def samples_path(csv_path: str | os.PathLike) -> Path:
    """``NAME.samples.npz`` next to ``NAME.csv`` (the name save_profile writes)."""
    return Path(csv_path).with_suffix(".samples.npz")


# ----------------------------------------------------------------------------- loading

def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate ``NAME.csv`` with its sidecar and raw samples when present."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such profile (expected a CSV file)")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{path}: cannot read profile: {e}") from None
    header = rows[0] if rows else None
    if not header or not any(h.strip() for h in header):
        raise InputError(f"{where(path, 1)}: empty profile, expected a header row with columns {', '.join(REQUIRED)}")
    for i, row in enumerate(rows[1:], start=2):
        # pandas would silently turn one extra field into an index column; refuse ragged rows here.
        if row and len(row) != len(header):
            raise InputError(f"{where(path, i)}: not a readable CSV row: {len(row)} fields, "
                             f"the header has {len(header)}")
    names = [h.strip() for h in header]
    dup = sorted({h for h in names if names.count(h) > 1 and h})
    if dup:
        raise InputError(f"{where(path, 1, dup[0])}: column appears more than once")
    # Row i of rows[1:] is line i + 2; blank lines (no field with text) are dropped.
    kept = [(i, row) for i, row in enumerate(rows[1:], start=2) if any(f.strip() for f in row)]
    lines = np.array([i for i, _ in kept], dtype=np.int64)
    data = {}
    for j, name in enumerate(names):
        values = np.empty(len(kept), dtype=object)
        values[:] = [row[j] for _, row in kept]
        data[name] = (values, None)
    table = _validate_table(data, str(path), lines=lines)

    meta: dict = {}
    side = sidecar_path(path)
    if side.is_file():
        meta = _read_meta(side)
    samples = None
    if "samples" in meta:
        spath = path.parent / meta["samples"]
        if not spath.is_file():
            raise InputError(f"{where(side, None, 'samples')}: raw-sample file {meta['samples']!r} "
                             f"not found (looked for {spath})")
        samples = _validate_samples(_read_npz(spath), table, str(spath))
    elif not side.is_file() and samples_path(path).is_file():
        spath = samples_path(path)
        samples = _validate_samples(_read_npz(spath), table, str(spath))
    return Profile(table, meta, samples, path)


def _numbers(raw: np.ndarray, parsed: np.ndarray | None) -> np.ndarray:
    """float64 values of a column; NaN where a field is not a number (blank, text)."""
    if parsed is not None:
        return parsed
    out = np.full(len(raw), np.nan)
    for i, v in enumerate(raw.tolist()):
        t = str(v).strip()
        # float() also takes "1_000" and non-ASCII digits, which a CSV number never is;
        # integers go through int() so that "-0" is 0, as pandas read it, not -0.0.
        if t and t.isascii() and "_" not in t:
            try:
                out[i] = float(int(t)) if t.lstrip("+-").isdigit() else float(t)
            except ValueError:
                pass
    return out


def _validate_table(data: dict, src: str, lines) -> dict:
    """Check every rule of the format; return read-only columns sorted by (seq_len, batch).

    ``data``: column name -> (values, float64 values or None to parse the values as text).
    """
    def loc(i: int, col: str | None) -> str:
        if lines is None:
            return f"{where(src, None, col)}: row {i}" if col else f"{src}: row {i}"
        return where(src, int(lines[i]), col)

    data = {str(c).strip(): v for c, v in data.items()}
    cols = list(data)
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise InputError(f"{where(src, 1 if lines is not None else None, missing[0])}: missing required "
                         f"column (a profile needs {', '.join(REQUIRED)})")
    n_rows = len(data[REQUIRED[0]][0])
    if n_rows == 0:
        raise InputError(f"{src}: profile has a header but no rows")

    known = [c for c in REQUIRED + OPTIONAL if c in cols]
    values = {}
    for col in known:
        raw = data[col][0]
        num = _numbers(*data[col])
        bad = ~np.isfinite(num)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            text = str(raw[i]).strip()
            what = "missing value" if text == "" else f"{text!r} is not a finite number"
            raise InputError(f"{loc(i, col)}: {what}")
        if col in INTEGER:
            frac = num != np.round(num)
            if frac.any():
                i = int(np.flatnonzero(frac)[0])
                raise InputError(f"{loc(i, col)}: {num[i]:g} is not an integer")
            low = num < 1
            if low.any():
                i = int(np.flatnonzero(low)[0])
                raise InputError(f"{loc(i, col)}: {num[i]:g} must be >= 1")
        elif col in _LATENCY:
            low = num <= 0
            if low.any():
                i = int(np.flatnonzero(low)[0])
                raise InputError(f"{loc(i, col)}: latency {num[i]:g} ms must be > 0")
        else:  # latency_ms_std, gpu_ms_mean
            low = num < 0
            if low.any():
                i = int(np.flatnonzero(low)[0])
                raise InputError(f"{loc(i, col)}: {num[i]:g} must be >= 0")
        values[col] = num

    def order(lo: str, hi: str, why: str):
        if lo in values and hi in values:
            bad = values[lo] > values[hi]
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise InputError(f"{loc(i, hi)}: {values[hi][i]:g} is below {lo} ({values[lo][i]:g}); {why}")

    pct = "percentiles must satisfy p50 <= p90 <= p99"
    order("latency_ms_p50", "latency_ms_p90", pct)
    order("latency_ms_p90", "latency_ms_p99", pct)
    order("latency_ms_min", "latency_ms_p50", "the minimum cannot exceed the median")
    order("latency_ms_min", "latency_ms_mean", "the minimum cannot exceed the mean")
    order("latency_ms_p99", "latency_ms_max", "the maximum cannot be below p99")
    order("latency_ms_mean", "latency_ms_max", "the maximum cannot be below the mean")

    batch = values["batch"].astype(np.int64)
    seq = values["seq_len"].astype(np.int64) if "seq_len" in values else np.zeros(n_rows, np.int64)
    seen: dict = {}
    for i, key in enumerate(zip(seq.tolist(), batch.tolist())):
        if key in seen:
            cell = f"batch={key[1]}" + (f", seq_len={key[0]}" if "seq_len" in values else "")
            first = seen[key]
            first_at = f"line {int(lines[first])}" if lines is not None else f"row {first}"
            raise InputError(f"{loc(i, 'batch')}: duplicate cell {cell} (first at {first_at})")
        seen[key] = i
    ub, us = _ascending(batch), _ascending(seq)
    if len(seen) != len(ub) * len(us):
        for s in us.tolist():
            for b in ub.tolist():
                if (s, b) not in seen:
                    raise InputError(f"{where(src, None, 'seq_len')}: incomplete grid: no row for batch={b}, "
                                     f"seq_len={s} (every batch x seq_len combination must be measured)")

    out = {"batch": batch, "seq_len": seq}
    for col in REQUIRED[1:] + OPTIONAL[1:]:
        if col in values:
            out[col] = values[col].astype(np.int64) if col in INTEGER else values[col]
    for col in cols:  # unknown columns travel along, unvalidated
        if col not in out:
            out[col] = np.asarray(data[col][0])
    order = np.lexsort((batch, seq))  # cells are unique, so the order is total
    for col, v in out.items():
        out[col] = v[order]
        out[col].flags.writeable = False
    return out


def _ascending(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a profile's few cells: np.unique of a plain array loads numpy.ma
    (7-12 ms of CPU in every run's start-up) to ask whether it is masked."""
    return np.array(sorted(set(values.tolist())), dtype=values.dtype)


def _read_meta(side: Path) -> dict:
    try:
        text = side.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{side}: cannot read sidecar: {e}") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{where(side, e.lineno)}: invalid JSON: {e.msg} (column {e.colno})") from None
    return _validate_meta(meta, str(side))


def _validate_meta(meta, src: str) -> dict:
    if not isinstance(meta, dict):
        raise InputError(f"{src}: sidecar must be a JSON object, got {type(meta).__name__}")
    schema = meta.get("schema")
    if schema is not None and schema != SCHEMA:
        raise InputError(f"{where(src, None, 'schema')}: {schema!r} is not supported (expected {SCHEMA!r})")
    for key in ("dispatch_overhead_us", "dispatch_overhead_us_per_sample"):
        if key in meta:
            v = meta[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InputError(f"{where(src, None, key)}: {v!r} must be a number >= 0 (microseconds)")
    if "samples" in meta and not (isinstance(meta["samples"], str) and meta["samples"]):
        raise InputError(f"{where(src, None, 'samples')}: {meta['samples']!r} must be a file name relative to the CSV")
    return meta


def _read_npz(spath: Path) -> dict:
    try:
        with np.load(spath, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:  # zipfile, pickle, OS and format errors all mean "unreadable"
        raise InputError(f"{spath}: not a readable .npz file: {e}") from None


def _samples_to_arrays(samples) -> dict:
    """Accept either the flat npz layout or a (batch, seq_len) -> array mapping."""
    if "latency_ms" in samples:
        return dict(samples)
    b, s, x = [], [], []
    for (bb, ss), arr in samples.items():
        arr = np.asarray(arr, dtype=np.float64).ravel()
        b.append(np.full(arr.size, bb, np.int64))
        s.append(np.full(arr.size, ss, np.int64))
        x.append(arr)
    cat = (lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt))
    return {"batch": cat(b, np.int64), "seq_len": cat(s, np.int64), "latency_ms": cat(x, np.float64)}


def _validate_samples(z: dict, columns: dict, src: str) -> dict:
    for key in ("batch", "seq_len", "latency_ms"):
        if key not in z:
            raise InputError(f"{where(src, None, key)}: missing array (a samples file holds batch, seq_len, latency_ms)")
    arrs = {k: np.asarray(z[k]) for k in ("batch", "seq_len", "latency_ms")}
    n = arrs["latency_ms"].shape
    for k, a in arrs.items():
        if a.ndim != 1 or a.shape != n:
            raise InputError(f"{where(src, None, k)}: shape {a.shape}, expected ({n[0]},) like latency_ms")
    for k in ("batch", "seq_len"):
        a = arrs[k]
        if not (np.issubdtype(a.dtype, np.integer) or (np.issubdtype(a.dtype, np.floating)
                                                        and np.all(a == np.round(a)))):
            raise InputError(f"{where(src, None, k)}: must hold integers, got {a.dtype}")
    lat = arrs["latency_ms"].astype(np.float64)
    bad = ~(np.isfinite(lat) & (lat > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{where(src, None, 'latency_ms')}: sample {i} is {float(lat[i])!r}; samples must be finite and > 0 ms")
    batch, seq = arrs["batch"].astype(np.int64), arrs["seq_len"].astype(np.int64)
    cells = list(zip(columns["seq_len"].tolist(), columns["batch"].tolist()))
    known = set(cells)
    order = np.lexsort((lat, batch, seq))
    batch, seq, lat = batch[order], seq[order], lat[order]
    keys = np.stack([seq, batch], axis=1)
    starts = np.flatnonzero(np.r_[True, np.any(keys[1:] != keys[:-1], axis=1)]) if len(lat) else np.zeros(0, int)
    ends = np.r_[starts[1:], len(lat)]
    out = {}
    for a, e in zip(starts.tolist(), ends.tolist()):
        s, b = int(seq[a]), int(batch[a])
        if (s, b) not in known:
            raise InputError(f"{src}: samples for batch={b}, seq_len={s}, a cell the profile table does not have")
        out[(b, s)] = lat[a:e].copy()
    for s, b in cells:
        if (b, s) not in out:
            raise InputError(f"{src}: no samples for batch={b}, seq_len={s} (every cell of the table needs samples)")
    return out


# ----------------------------------------------------------------------------- saving

def save_profile(profile_or_df, meta: dict | None, path: str | os.PathLike, samples=None) -> Profile:
    """Validate, then write ``NAME.csv``, ``NAME.json`` and (with samples) ``NAME.samples.npz``.

    ``meta`` None keeps a Profile's own metadata; ``samples`` None keeps a Profile's own
    samples. Each file is written to a temporary file in the same folder and moved into
    place with :func:`os.replace`, so a reader never sees a half-written file. The sidecar
    names the samples file only when one is written, so a stale one is never picked up.
    Returns the profile as it will load from ``path``.
    """
    path = Path(path)
    if isinstance(profile_or_df, Profile):
        prof = profile_or_df
        meta = dict(prof.meta if meta is None else meta)
        samples = prof.samples if samples is None else samples
        known = REQUIRED + OPTIONAL  # already numbers in a Profile; unknown columns are never parsed
        prof = Profile._from_columns({k: (v, v.astype(np.float64) if k in known else None)
                                      for k, v in prof.columns.items()}, meta, samples, path)
    else:
        prof = Profile.from_frame(profile_or_df, meta, samples, path)
    meta = dict(prof.meta)
    meta.setdefault("schema", SCHEMA)
    meta.pop("samples", None)

    table = prof.table
    cols = ["batch"] + (["seq_len"] if prof.has_seq_len else []) + \
        [c for c in table.columns if c not in ("batch", "seq_len")]
    path.parent.mkdir(parents=True, exist_ok=True)

    if prof.samples is not None:
        spath = samples_path(path)
        keys = sorted(prof.samples, key=lambda k: (k[1], k[0]))
        flat = {
            "batch": np.concatenate([np.full(prof.samples[k].size, k[0], np.int32) for k in keys]),
            "seq_len": np.concatenate([np.full(prof.samples[k].size, k[1], np.int32) for k in keys]),
            "latency_ms": np.concatenate([prof.samples[k] for k in keys]).astype(np.float32),
        }
        _atomic_write(spath, lambda f: np.savez_compressed(f, **flat), binary=True)
        meta["samples"] = spath.name
    _atomic_write(sidecar_path(path), lambda f: f.write(json.dumps(meta, indent=2, default=str) + "\n"))
    # The CSV last: a reader that finds the new CSV also finds its sidecar and samples.
    _atomic_write(path, lambda f: table[cols].to_csv(f, index=False, lineterminator="\n"))
    return load_profile(path)


def _atomic_write(path: Path, write, binary: bool = False) -> None:
    with replaced_atomically(path) as tmp:
        with open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""})) as f:
            write(f)
