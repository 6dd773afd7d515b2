"""Reading and writing request traces.

``load_trace`` recognises three formats: schedsim's own CSV/Parquet, the Azure LLM
inference trace 2023 CSV and Mooncake JSON lines. Every problem a user can fix is an
:class:`~schedsim.errors.InputError` whose one line names the file, the line (CSV line
numbers are 1-based with the header on line 1), the field and what is wrong.

The fast path hands parsing to pyarrow and validates with vector expressions; only
when something is wrong do we rescan the file (with the csv/json modules) to find the
exact line, so a clean 2,000,000-row trace costs about what pyarrow costs. A small CSV
trace of plain numbers is read with the csv module instead (:func:`_read_plain`): importing
pyarrow costs more than parsing it; anything else in it goes to pyarrow, as before.

schedsim CSV columns (header required; unknown columns are ignored and listed in
``trace.meta["ignored_columns"]``):

==============  =====================================================  ========
column          meaning                                                default
==============  =====================================================  ========
arrival_s       seconds from the start, non-decreasing (required)
request_id      unique integer                                         row number
batch           samples carried by the request, >= 1                   1
seq_len         sequence length, >= 0                                  0
input_tokens    prompt tokens, >= 0                                    0
output_tokens   tokens to generate, >= 0                               0
priority        priority level, >= 0                                   0
timeout_us      queue timeout in microseconds, >= 0                    0
hash_ids        prefix-block hash ids separated by spaces (Parquet: a  none
                list column)
==============  =====================================================  ========
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from schedsim.errors import InputError, where
from schedsim.files import replaced_atomically
from schedsim.traces.table import Trace

if TYPE_CHECKING:
    import pandas as pd  # imported where used: `schedsim run` must not pay its ~0.35 s
    import pyarrow as pa

__all__ = [
    "COLUMNS", "PUBLIC_TRACES", "load_trace", "save_trace", "scale_rate", "head",
    "time_window", "trace_stats", "sha256_file", "fetch_public_trace",
]

# name -> (dtype in Trace, smallest valid value, default). arrival_s is handled apart.
_INT_COLUMNS = {
    "request_id": (np.int64, None, None),
    "batch": (np.int32, 1, 1),
    "seq_len": (np.int32, 0, 0),
    "input_tokens": (np.int32, 0, 0),
    "output_tokens": (np.int32, 0, 0),
    "priority": (np.int16, 0, 0),
    "timeout_us": (np.int64, 0, 0),
}
COLUMNS = ("arrival_s", *_INT_COLUMNS, "hash_ids")
"""Columns schedsim reads from its own CSV/Parquet files, in the order it writes them."""

AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
_PARQUET_SUFFIXES = {".parquet", ".pq"}
_PLAIN_CSV_BYTES = 1 << 18
"""CSV traces up to this size are read without pyarrow when every field is a plain number:
importing pyarrow takes about 0.04 s of CPU, the csv module reads 10,000 rows in about that."""


def _arrow_pool():
    """Arrow's buffers from malloc rather than its default pool (mimalloc), which keeps what the
    CSV reader frees: then numpy's arrays reuse that memory, and a 2M-row read costs about
    25 MB and 50 ms less (fresh pages are slow to fault in)."""
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)

    return pa.system_memory_pool()


_META_KEY = b"schedsim.meta"


# --------------------------------------------------------------------------- loading

def load_trace(path) -> Trace:
    """Read a trace, recognising its format by extension and header.

    ``.parquet``/``.pq``: schedsim Parquet. ``.jsonl``: Mooncake. Any other name is
    CSV: the Azure LLM 2023 importer when the header is exactly
    ``TIMESTAMP,ContextTokens,GeneratedTokens``, schedsim CSV otherwise.
    """
    path_str = str(path)
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path_str}: no such file")
    if p.is_dir():
        raise InputError(f"{path_str}: is a directory, expected a trace file")
    if p.stat().st_size == 0:
        raise InputError(f"{path_str}: file is empty")
    suffix = p.suffix.lower()
    if suffix in _PARQUET_SUFFIXES:
        return _load_parquet(p, path_str)
    if suffix == ".jsonl":
        return _load_mooncake(p, path_str)
    header = _csv_header(p, path_str)
    if header == AZURE_HEADER:
        return _load_azure(p, path_str)
    return _load_csv(p, path_str, header)


def _csv_header(p: Path, name: str) -> list[str]:
    # The csv module reads just the header line (quotes honoured); pyarrow reads the rest.
    try:
        with open(p, newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), None)
    except UnicodeDecodeError:
        raise InputError(f"{name}: not a UTF-8 text file; expected CSV with a header line") from None
    except csv.Error as e:
        raise InputError(f"{name}:1: cannot read the CSV header: {e}") from None
    if not header or not any(h.strip() for h in header):
        raise InputError(f"{name}:1: no header line; expected column names such as arrival_s")
    dups = sorted({c for c in header if header.count(c) > 1})
    if dups:
        raise InputError(f"{name}:1: column {dups[0]!r} appears more than once in the header")
    return header


def _read_csv(p: Path, types: dict[str, pa.DataType], *, raw: bool = False) -> pa.Table:
    """Read only ``types``' columns with exactly those types.

    We call pyarrow's reader directly: pandas' ``engine="pyarrow"`` converts dtypes
    after parsing and silently truncates ``5.5`` to ``5`` for an int64 column.
    ``raw`` keeps every field as text (no nulls) for diagnosis.
    """
    import pyarrow.csv as pcsv  # lazy: pyarrow.csv loads only where a CSV is read or written

    convert = pcsv.ConvertOptions(include_columns=list(types), column_types=types)
    if raw:
        convert.strings_can_be_null = False
        convert.null_values = []
    return pcsv.read_csv(p, read_options=pcsv.ReadOptions(encoding="utf8"), convert_options=convert,
                         memory_pool=_arrow_pool())


def _numpy(col) -> np.ndarray:
    """Numeric Array or ChunkedArray to numpy; nulls (blank fields) become NaN.

    Without nulls, DLPack hands the buffer over (zero-copy, read-only). Not pyarrow's
    ``to_numpy``: that goes through pyarrow's pandas layer, which imports pandas
    (about 0.35 s) on first use. Nulls only appear in traces that then fail validation.
    """
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)
    if col.null_count:
        import pyarrow.compute as pc  # here: its import costs ~40 ms that most loads skip

        return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks(memory_pool=_arrow_pool())
    if hasattr(col, "__dlpack__"):  # pyarrow >= 15
        return np.from_dlpack(col)
    return col.to_numpy(zero_copy_only=False)


def _load_csv(p: Path, name: str, header: list[str]) -> Trace:
    if "arrival_s" not in header:
        raise InputError(f"{name}:1: no arrival_s column (columns found: {', '.join(map(str, header))})")
    numeric = [c for c in header if c in _INT_COLUMNS or c == "arrival_s"]
    ignored = [str(c) for c in header if c not in COLUMNS]
    table, cols = None, _read_plain(p, header, numeric)
    if cols is None:
        import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)

        try:
            table, cols = _read_numeric(p, numeric, "hash_ids" in header)
        except (pa.ArrowException, ValueError, UnicodeDecodeError) as e:
            # Something is malformed or not a number: rescan slowly to say where.
            cols = _csv_diagnose(p, name, header, numeric, e)
    if len(cols["arrival_s"]) == 0:
        raise InputError(f"{name}: no requests (the file has only a header line)")
    locate = _CsvLocator(p, name)
    trace = _build(cols, locate, name)
    if "hash_ids" in header:
        if table is None:
            import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)

            table = _read_csv(p, {"hash_ids": pa.string()})
        offsets, ids = _parse_hash_strings(table.column("hash_ids"), locate)
        trace = dataclasses.replace(trace, hash_offsets=offsets, hash_ids=ids)
    meta = {"format": "schedsim-csv", "columns": [c for c in COLUMNS if c in header]}
    if ignored:
        meta["ignored_columns"] = ignored
    return dataclasses.replace(trace, source=name, meta=meta)


_PLAIN_UNSAFE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # control characters but "\n"
_PLAIN_NUMBER = {  # one column's fields joined by newlines, each a plain decimal number
    "int": re.compile(r"-?[0-9]+(?:\n-?[0-9]+)*", re.ASCII),
    "float": re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
                        r"(?:\n-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)*", re.ASCII),
}


def _read_plain(p: Path, header: list[str], numeric: list[str]) -> dict[str, np.ndarray] | None:
    """The numeric columns of a small CSV trace of plain numbers, as pyarrow's exact read gives
    them (:func:`_read_numeric`), read with the csv module; None (pyarrow's to read) for a larger
    file or anything else: a quote, a byte-order mark or other non-ASCII text, a control character
    (a lone carriage return, a tab), a hash_ids column, a row of another length, a field that is
    not a plain decimal number (blank, spaced, ``nan``, ``1_0``), an integer outside its column's
    type, no rows. Both round a decimal to the nearest float."""
    if "hash_ids" in header or p.stat().st_size > _PLAIN_CSV_BYTES:
        return None
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    # Lines end at "\n" or "\r\n" alone: pyarrow also ends one at a lone "\r", splitlines() at
    # other control characters too.
    text = text.replace("\r\n", "\n")
    if '"' in text or not text.isascii() or _PLAIN_UNSAFE.search(text):
        return None
    rows = [r for r in csv.reader(text.split("\n")[1:]) if r]
    if not rows or any(len(r) != len(header) for r in rows):
        return None
    fields = dict(zip(header, zip(*rows)))
    cols = {}
    for c in numeric:
        values = fields[c]
        if c == "arrival_s":
            if not _PLAIN_NUMBER["float"].fullmatch("\n".join(values)):
                return None
            cols[c] = np.array([float(v) for v in values], dtype=np.float64)
            continue
        dtype = _INT_COLUMNS[c][0]
        if not _PLAIN_NUMBER["int"].fullmatch("\n".join(values)):
            return None
        ints = [int(v) for v in values]
        if min(ints) < np.iinfo(dtype).min or max(ints) > np.iinfo(dtype).max:
            return None
        cols[c] = np.array(ints, dtype=dtype)
    return cols


def _read_numeric(p: Path, numeric: list[str], hash_ids: bool) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """The numeric columns as numpy arrays (and the table, for hash_ids).

    Integer columns are parsed straight into their own types, which saves a float64 copy
    of each; a field that is not a plain integer (``5.5``, ``1e3``, out of range) fails
    that parse, and the float64 read, as before, either accepts it (a whole number) or
    fails in turn so that :func:`_csv_diagnose` names it.
    """
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)
    extra = {"hash_ids": pa.string()} if hash_ids else {}
    exact = {c: pa.float64() if c == "arrival_s" else pa.from_numpy_dtype(_INT_COLUMNS[c][0]) for c in numeric}
    try:
        table = _read_csv(p, exact | extra)
    except (pa.ArrowException, ValueError, UnicodeDecodeError):
        table = _read_csv(p, {c: (pa.int64() if c == "request_id" else pa.float64()) for c in numeric} | extra)
    return table, {c: _numpy(table.column(c)) for c in numeric}


def _csv_diagnose(p, name, header, numeric, error) -> dict[str, np.ndarray]:
    """Find the first malformed row or non-number and raise; else return float columns."""
    import pandas as pd  # only after a failed parse: `schedsim run` must not pay for pandas
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)

    reader = None
    try:
        with open(p, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            next(reader)
            for rec in reader:
                if rec and len(rec) != len(header):
                    raise InputError(f"{name}:{reader.line_num}: expected {len(header)} fields "
                                     f"as in the header, found {len(rec)}")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not a UTF-8 text file; expected CSV with a header line") from None
    except csv.Error as e:
        raise InputError(f"{name}:{reader.line_num if reader else 1}: malformed CSV: {e}") from None
    try:
        table = _read_csv(p, {c: pa.string() for c in numeric}, raw=True)
    except (pa.ArrowException, ValueError) as e2:
        raise InputError(f"{name}: cannot read as CSV: {_first_line(e2)}") from None
    cols, first_bad = {}, None
    for c in numeric:
        text = pd.Series(table.column(c).to_numpy(zero_copy_only=False), dtype=object).astype(str)
        values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        stripped = text.str.strip()
        bad = np.flatnonzero(np.isnan(values) & (stripped != "").to_numpy()
                             & ~stripped.str.lower().isin(["nan", "na", "null"]).to_numpy())
        if bad.size and (first_bad is None or bad[0] < first_bad[0]):
            first_bad = (int(bad[0]), c, text.iloc[bad[0]])
        cols[c] = values
    if first_bad is not None:
        row, c, text = first_bad
        raise InputError(f"{_CsvLocator(p, name)(row, c)}: {text!r} is not a number")
    if not cols:
        raise InputError(f"{name}: cannot read as CSV: {_first_line(error)}")
    return cols  # float64 stand-ins; _build checks whole numbers and casts back


class _CsvLocator:
    """Maps a data-row index to ``file:line: field``; scans the file only when asked."""

    def __init__(self, p: Path, name: str):
        self.p, self.name = p, name

    def __call__(self, row: int, field: str) -> str:
        return where(self.name, self.line(row), field)

    def line(self, row: int) -> int:
        # Blank lines are skipped by the parser but still count as file lines; quoted
        # fields may span lines, so let the csv module keep count.
        with open(self.p, newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.reader(f)
            next(reader)
            last, i = reader.line_num, -1
            for rec in reader:
                start, last = last + 1, reader.line_num
                if not rec:
                    continue
                i += 1
                if i == row:
                    return start
        return row + 2


class _RowLocator:
    """For Parquet, which has no text lines: ``file: row N: field`` (1-based rows)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, row: int, field: str) -> str:
        return f"{self.name}: row {row + 1}: {field}"


def _fmt(v: float) -> str:
    if np.isfinite(v) and v == int(v):
        return str(int(v))
    return repr(float(v))


def _build(cols: dict[str, np.ndarray], locate, name: str) -> Trace:
    """Validate numeric columns (float64 with NaN for blanks, or integers) into a Trace."""
    arr = np.asarray(cols["arrival_s"], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        v = arr[bad[0]]
        what = "is empty or NaN" if np.isnan(v) else f"{float(v)!r} is not finite"
        raise InputError(f"{locate(int(bad[0]), 'arrival_s')}: {what}")
    bad = np.flatnonzero(arr < 0)
    if bad.size:
        raise InputError(f"{locate(int(bad[0]), 'arrival_s')}: {float(arr[bad[0]])!r} is negative; "
                         "arrival times are seconds from the start, >= 0")
    bad = np.flatnonzero(arr >= MAX_ARRIVAL_S)
    if bad.size:
        raise InputError(f"{locate(int(bad[0]), 'arrival_s')}: {float(arr[bad[0]])!r} is too late; "
                         f"times are held as int64 nanoseconds, so arrivals must be below {MAX_ARRIVAL_S:.0e} s")
    bad = np.flatnonzero(arr[1:] < arr[:-1])
    if bad.size:
        i = int(bad[0]) + 1
        raise InputError(f"{locate(i, 'arrival_s')}: {float(arr[i])!r} is earlier than the previous "
                         f"row's {float(arr[i - 1])!r}; arrivals must be non-decreasing")
    out = {}
    for c, (dtype, lo, _default) in _INT_COLUMNS.items():
        if c not in cols:
            continue
        v = cols[c]
        if v.dtype.kind == "f":
            bad = np.flatnonzero(~np.isfinite(v))
            if bad.size:
                x = v[bad[0]]
                what = "is empty or NaN" if np.isnan(x) else f"{float(x)!r} is not finite"
                raise InputError(f"{locate(int(bad[0]), c)}: {what}")
            bad = np.flatnonzero(v != np.floor(v))
            if bad.size:
                raise InputError(f"{locate(int(bad[0]), c)}: {float(v[bad[0]])!r} is not a whole number")
        info = np.iinfo(dtype)
        if lo is not None:
            bad = np.flatnonzero(v < lo)
            if bad.size:
                why = ("a request carries at least one sample" if c == "batch" else "must be >= 0")
                raise InputError(f"{locate(int(bad[0]), c)}: {_fmt(v[bad[0]])} is below {lo}; {why}")
        # A column read as the Trace's own type cannot be out of its range. ``>= max + 1``: as a
        # float, int64's max rounds up to 2**63, which ``> max`` let through to a wrapped cast.
        bad = np.flatnonzero((v >= info.max + 1) | (v < info.min)) if v.dtype != dtype else ()
        if len(bad):
            raise InputError(f"{locate(int(bad[0]), c)}: {_fmt(v[bad[0]])} is out of range "
                             f"(at most {info.max})")
        out[c] = v.astype(dtype, copy=False)
    if "request_id" in out:
        ids = out["request_id"]
        order = np.argsort(ids, kind="stable")
        same = np.flatnonzero(ids[order[1:]] == ids[order[:-1]])
        if same.size:
            rows = np.flatnonzero(ids == ids[order[same[0]]])
            first, dup = int(rows[0]), int(rows[1])
            loc_first = locate(first, "request_id").rsplit(": ", 1)[0]
            raise InputError(f"{locate(dup, 'request_id')}: {int(ids[dup])} is already used at "
                             f"{loc_first}; request ids must be unique")
    return Trace.from_arrivals(arr, source=name, **out)


def _parse_hash_strings(strings: pa.ChunkedArray, locate) -> tuple[np.ndarray, np.ndarray]:
    """Space-separated integers per row into CSR (offsets, ids); blank means none."""
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)
    import pyarrow.compute as pc  # lazy: pyarrow.compute costs ~40 ms of start-up that most loads skip

    lists = pc.utf8_split_whitespace(pc.utf8_trim_whitespace(strings))
    flat, rows = pc.list_flatten(lists), pc.list_parent_indices(lists)
    # A blank field splits into one empty token: drop those. Computed without Python
    # scalars (a cast to bool is "length > 0"): converting one imports pandas, see _numpy.
    nonempty = pc.cast(pc.utf8_length(flat), pa.bool_())
    flat, rows = flat.filter(nonempty), _numpy(rows.filter(nonempty))
    lengths = np.bincount(rows, minlength=len(strings))
    try:
        ids = _numpy(pc.cast(flat, pa.int64()))
    except pa.ArrowInvalid:
        ok = pc.match_substring_regex(flat, r"^[+-]?\d+$").to_numpy(zero_copy_only=False)
        k = int(np.flatnonzero(~ok)[0])
        raise InputError(f"{locate(int(rows[k]), 'hash_ids')}: {flat[k].as_py()!r} is not an integer") from None
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, ids


def _load_parquet(p: Path, name: str) -> Trace:
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)
    import pyarrow.compute as pc  # lazy: pyarrow.compute costs ~40 ms of start-up that most loads skip
    import pyarrow.parquet as pq  # lazy: pyarrow.parquet costs start-up that CSV traces skip

    try:
        schema = pq.read_schema(p)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{name}: not a readable Parquet file: {_first_line(e)}") from None
    names = list(schema.names)
    if "arrival_s" not in names:
        raise InputError(f"{name}: no arrival_s column (columns found: {', '.join(names)})")
    wanted = [c for c in COLUMNS if c in names]
    try:
        # ParquetFile, not pq.read_table: the dataset layer behind that imports pandas.
        with pq.ParquetFile(p) as f:
            table = f.read(columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{name}: not a readable Parquet file: {_first_line(e)}") from None
    if table.num_rows == 0:
        raise InputError(f"{name}: no requests (the file has no rows)")
    cols = {}
    for c in wanted:
        if c == "hash_ids":
            continue
        t = table.schema.field(c).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
            raise InputError(f"{name}: {c}: column has type {t}, expected numbers")
        col = table.column(c)
        if pa.types.is_integer(t) and col.null_count == 0:
            cols[c] = _numpy(col)  # _build checks the range of the column's own type
        else:
            cols[c] = _numpy(pc.cast(col, pa.float64(), memory_pool=_arrow_pool()))  # nulls become NaN
    trace = _build(cols, _RowLocator(name), name)
    if "hash_ids" in wanted:
        col = table.column("hash_ids").combine_chunks()
        if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            raise InputError(f"{name}: hash_ids: column has type {col.type}, expected a list of integers")
        offsets, ids = _csr_from_lists(col)
        trace = dataclasses.replace(trace, hash_offsets=offsets, hash_ids=ids)
    meta = {"format": "schedsim-parquet", "columns": wanted}
    ignored = [c for c in names if c not in COLUMNS]
    if ignored:
        meta["ignored_columns"] = ignored
    saved = (schema.metadata or {}).get(_META_KEY)
    if saved:
        meta["saved_meta"] = json.loads(saved)
    return dataclasses.replace(trace, source=name, meta=meta)


def _csr_from_lists(col) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)
    import pyarrow.compute as pc  # lazy: pyarrow.compute costs ~40 ms of start-up that most loads skip

    # Lengths counted from parent indices (a null list has none, as list_flatten agrees):
    # fill_null(list_value_length, 0) would convert the Python 0 and import pandas, see _numpy.
    lengths = np.bincount(_numpy(pc.list_parent_indices(col)), minlength=len(col))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = _numpy(pc.cast(pc.list_flatten(col), pa.int64()))
    return offsets, np.ascontiguousarray(ids, dtype=np.int64)


# ------------------------------------------------------------------------- importers

def _load_azure(p: Path, name: str) -> Trace:
    """Azure LLM inference trace 2023: ``TIMESTAMP,ContextTokens,GeneratedTokens``."""
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)
    locate = _CsvLocator(p, name)
    tokens = AZURE_HEADER[1:]
    try:
        table = _read_csv(p, {"TIMESTAMP": pa.string(), **{c: pa.float64() for c in tokens}})
        cols = {c: _numpy(table.column(c)) for c in tokens}
    except (pa.ArrowException, ValueError, UnicodeDecodeError) as e:
        cols = _csv_diagnose(p, name, AZURE_HEADER, tokens, e)
        table = _read_csv(p, {"TIMESTAMP": pa.string()}, raw=True)
    stamps = table.column("TIMESTAMP").to_pylist()
    if len(stamps) == 0:
        raise InputError(f"{name}: no requests (the file has only a header line)")
    ns = _azure_ns_plain(stamps)
    if ns is None:
        import pandas as pd  # only for stamps off the plain form: `schedsim run` must not pay for pandas

        ns = _azure_ns(pd.Series(stamps, dtype=object).fillna(""), locate)
    order = None
    if np.any(ns[1:] < ns[:-1]):
        order = np.argsort(ns, kind="stable")
    t0 = ns.min()
    arrival = (ns - t0) / 1e9  # integer ns first: the 7-digit fraction stays exact
    checked = _build({"arrival_s": np.zeros(len(ns)), "input_tokens": cols["ContextTokens"],
                     "output_tokens": cols["GeneratedTokens"]},
                    lambda row, f: locate(row, {"input_tokens": "ContextTokens",
                                                "output_tokens": "GeneratedTokens"}.get(f, f)), name)
    inp, out = checked.input_tokens, checked.output_tokens
    rid = np.arange(len(ns), dtype=np.int64)
    meta = {"format": "azure-llm-2023", "columns": ["arrival_s", "seq_len", "input_tokens", "output_tokens"],
            "start": str(stamps[int(np.argmin(ns))] or "").strip()}
    if order is not None:
        arrival, inp, out, rid = arrival[order], inp[order], out[order], rid[order]
        meta["sorted"] = "rows were not in time order; sorted stably by TIMESTAMP (request_id keeps the file row)"
    return Trace.from_arrivals(arrival, input_tokens=inp, output_tokens=out, seq_len=inp,
                               request_id=rid, source=name, meta=meta)


_AZURE_PLAIN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})?", re.ASCII)


def _azure_ns_plain(stamps: list) -> np.ndarray | None:
    """:func:`_azure_ns` without pandas (its import and exit cost ~0.35 s of a ``schedsim
    run``), for the form every Azure trace has: exactly ``YYYY-mm-dd HH:MM:SS[.f{1,9}]``,
    in the years pandas' nanoseconds cover. ``None`` for anything else (spaces, nulls, an
    invalid date): :func:`_azure_ns` then parses or reports it as before."""
    match = _AZURE_PLAIN.fullmatch
    if not all(type(s) is str and match(s) for s in stamps):
        return None
    try:   # numpy checks the calendar (month, day of month, hour < 24, ...) as pandas does
        secs = np.array([s[:19] for s in stamps], dtype="datetime64[s]")
    except ValueError:
        return None
    if secs.min() < np.datetime64("1678-01-01") or secs.max() >= np.datetime64("2262-01-01"):
        return None
    frac_ns = np.array([int(s[20:].ljust(9, "0")) for s in stamps], dtype=np.int64)
    return secs.astype("datetime64[ns]").astype(np.int64) + frac_ns


def _azure_ns(ts: "pd.Series", locate) -> np.ndarray:
    """``YYYY-mm-dd HH:MM:SS[.fffffff]`` to int64 ns; datetime would round the 7th digit."""
    import pandas as pd  # lazy: pandas costs about 0.35 s of start-up

    ts = ts.astype(str).str.strip()
    whole = ts.str.slice(0, 19)
    frac = ts.str.slice(19)
    secs = pd.to_datetime(whole, format="%Y-%m-%d %H:%M:%S", errors="coerce")
    frac_ok = frac.str.fullmatch(r"(\.\d{1,9})?")
    bad = np.flatnonzero(secs.isna().to_numpy() | ~frac_ok.fillna(False).to_numpy(dtype=bool))
    if bad.size:
        raise InputError(f"{locate(int(bad[0]), 'TIMESTAMP')}: {ts.iloc[bad[0]]!r} is not a time "
                         "like 2023-11-16 18:17:03.9799600")
    frac_ns = frac.str.slice(1).str.pad(9, side="right", fillchar="0").astype("int64").to_numpy()
    return secs.to_numpy().astype("datetime64[ns]").astype(np.int64) + frac_ns


def _load_mooncake(p: Path, name: str) -> Trace:
    """Mooncake JSON lines: timestamp (ms), input_length, output_length, hash_ids."""
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)
    import pyarrow.json as pj  # lazy: pyarrow.json costs start-up that non-JSON traces skip

    schema = pa.schema([("timestamp", pa.float64()), ("input_length", pa.float64()),
                        ("output_length", pa.float64()), ("hash_ids", pa.list_(pa.int64()))])
    opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(p, parse_options=opts)
    except (pa.ArrowException, ValueError):
        _jsonl_diagnose(p, name)
        raise
    if table.num_rows == 0:
        raise InputError(f"{name}: no requests")
    locate = _JsonlLocator(p, name)
    fields = {"timestamp": "arrival_s", "input_length": "input_tokens", "output_length": "output_tokens"}
    cols = {}
    for key, col in fields.items():
        values = _numpy(table.column(key))
        if np.all(np.isnan(values)):
            raise InputError(f"{name}: no {key!r} field in any line; expected Mooncake JSON lines "
                             '{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}')
        cols[col] = values
    ts = cols.pop("arrival_s")
    checked = _build({"arrival_s": np.zeros(len(ts)), **cols},
                     lambda row, f: locate(row, {"input_tokens": "input_length",
                                                 "output_tokens": "output_length"}.get(f, f)), name)
    bad = np.flatnonzero(~np.isfinite(ts) | (ts < 0))
    if bad.size:
        v = ts[bad[0]]
        what = "is missing or null" if np.isnan(v) else f"{_fmt(v)} is not a time in ms >= 0"
        raise InputError(f"{locate(int(bad[0]), 'timestamp')}: {what}")
    offsets, ids = _csr_from_lists(table.column("hash_ids").combine_chunks())
    inp, out = checked.input_tokens, checked.output_tokens
    rid = np.arange(len(ts), dtype=np.int64)
    meta = {"format": "mooncake-jsonl", "columns": ["arrival_s", "seq_len", "input_tokens",
                                                     "output_tokens", "hash_ids"]}
    if np.any(ts[1:] < ts[:-1]):
        order = np.argsort(ts, kind="stable")
        ts, inp, out, rid = ts[order], inp[order], out[order], rid[order]
        offsets, ids = _csr_take(offsets, ids, order)
        meta["sorted"] = ("timestamps were not in order; sorted stably by timestamp "
                          "(request_id keeps the file row)")
    arrival = (ts - ts[0]) / 1000.0
    trace = Trace.from_arrivals(arrival, input_tokens=inp, output_tokens=out, seq_len=inp,
                                request_id=rid, source=name, meta=meta)
    return dataclasses.replace(trace, hash_offsets=offsets, hash_ids=ids)


def _csr_take(offsets: np.ndarray, ids: np.ndarray, order: np.ndarray):
    lengths = np.diff(offsets)[order]
    new = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    gather = np.repeat(offsets[:-1][order] - new[:-1], lengths) + np.arange(new[-1])
    return new, ids[gather]


class _JsonlLocator:
    def __init__(self, p: Path, name: str):
        self.p, self.name = p, name

    def __call__(self, row: int, field: str) -> str:
        # pyarrow skips blank lines; count them back in for the file line number.
        i = -1
        with open(self.p, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    i += 1
                    if i == row:
                        return where(self.name, lineno, field)
        return where(self.name, row + 1, field)


def _jsonl_diagnose(p: Path, name: str) -> None:
    """Raise InputError for the first line that is not a JSON object of the right shape."""
    with open(p, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{name}:{lineno}: not valid JSON: {e.msg} (column {e.colno})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{name}:{lineno}: expected a JSON object, found {type(obj).__name__}")
            for key in ("timestamp", "input_length", "output_length"):
                v = obj.get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                    raise InputError(f"{name}:{lineno}: {key}: {v!r} is not a number")
            h = obj.get("hash_ids")
            if h is not None and not (isinstance(h, list) and all(isinstance(x, int) for x in h)):
                raise InputError(f"{name}:{lineno}: hash_ids: expected a list of integers")
    raise InputError(f"{name}: cannot read as Mooncake JSON lines")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# --------------------------------------------------------------------------- saving

def save_trace(trace: Trace, path) -> Path:
    """Write ``trace`` as CSV, or Parquet for ``.parquet``/``.pq``, atomically.

    Only columns that differ from their defaults are written (``request_id`` only
    when it is not the row number), so a plain arrival trace stays one column.
    The file appears complete or not at all: we write a temp file beside it and
    ``os.replace`` it into place.
    """
    import pyarrow as pa  # lazy: a small plain CSV trace is read without pyarrow (_read_plain)
    import pyarrow.compute as pc  # lazy: pyarrow.compute costs ~40 ms of start-up that most loads skip

    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in _PARQUET_SUFFIXES | {".csv"}:
        raise InputError(f"{path}: unknown trace extension {p.suffix!r}; use .csv, .parquet or .pq")
    if not p.parent.is_dir():
        raise InputError(f"{path}: directory {str(p.parent)!r} does not exist")
    n = len(trace)
    arrays: dict[str, pa.Array] = {"arrival_s": pa.array(trace.arrival_s, type=pa.float64())}
    if not np.array_equal(trace.request_id, np.arange(n)):
        arrays["request_id"] = pa.array(trace.request_id)
    for c, (_dtype, _lo, default) in _INT_COLUMNS.items():
        if c != "request_id" and np.any(getattr(trace, c) != default):
            arrays[c] = pa.array(getattr(trace, c))
    if trace.hash_offsets is not None:
        lists = pa.LargeListArray.from_arrays(pa.array(trace.hash_offsets, type=pa.int64()),
                                              pa.array(trace.hash_ids, type=pa.int64()))
        if suffix == ".csv":
            lists = pc.binary_join(pc.cast(lists, pa.large_list(pa.large_string())),
                                   pa.scalar(" ", pa.large_string()))
        arrays["hash_ids"] = lists
    table = pa.table(arrays)
    with replaced_atomically(p) as tmp:
        if suffix == ".csv":
            import pyarrow.csv as pcsv  # lazy: pyarrow.csv loads only where a CSV is read or written

            # Our column names never need quotes; pyarrow would quote them under "needed".
            opts = pcsv.WriteOptions(quoting_style="needed", quoting_header="none")
            pcsv.write_csv(table, tmp, write_options=opts)
        else:
            import pyarrow.parquet as pq  # lazy: pyarrow.parquet costs start-up that CSV traces skip

            meta = json.dumps(trace.meta, default=str).encode()
            table = table.replace_schema_metadata({_META_KEY: meta})
            pq.write_table(table, tmp)
    return p


# -------------------------------------------------------------------------- helpers

MAX_ARRIVAL_S = 9e9
"""Latest arrival time a trace may hold: int64 nanoseconds end at about 9.22e9 s."""

EPOCH_LIKE_S = 1e8
"""A trace whose first arrival is this late (over three years) holds clock times, such as
Unix time, rather than seconds from the start."""


def from_first_arrival(trace: Trace) -> Trace:
    """``trace`` with times measured from its first arrival when they look like clock times
    (the first arrival at or after :data:`EPOCH_LIKE_S`); the shift is ``meta["arrival_offset_s"]``."""
    if not len(trace) or trace.arrival_s[0] < EPOCH_LIKE_S:
        return trace
    offset = float(trace.arrival_s[0])
    meta = dict(trace.meta) | {"arrival_offset_s": offset}
    return dataclasses.replace(trace, arrival_s=trace.arrival_s - offset, meta=meta)


def scale_rate(trace: Trace, factor: float) -> Trace:
    """Replay at ``factor`` times the rate: arrival times divided by ``factor``."""
    factor = float(factor)
    if not (np.isfinite(factor) and factor > 0):
        raise InputError(f"rate scale: {factor!r} must be a finite number > 0")
    meta = dict(trace.meta)
    meta["rate_scale"] = meta.get("rate_scale", 1.0) * factor
    arrival_s = trace.arrival_s / factor
    if len(arrival_s) and not arrival_s[-1] < MAX_ARRIVAL_S:
        raise InputError(f"rate scale: {factor!r} puts the last arrival at {float(arrival_s[-1]):.3g} s, "
                         f"past the {MAX_ARRIVAL_S:.0e} s that int64 nanoseconds hold")
    return dataclasses.replace(trace, arrival_s=arrival_s, meta=meta)


def head(trace: Trace, n: int) -> Trace:
    """The first ``n`` requests (all of them when the trace is shorter)."""
    if n < 0:
        raise InputError(f"head: {n} requests; must be >= 0")
    return trace.slice(0, min(int(n), len(trace)))


def time_window(trace: Trace, start_s: float = 0.0, end_s: float | None = None, *,
                rebase: bool = True) -> Trace:
    """Requests arriving in ``[start_s, end_s)``; with ``rebase`` times restart at 0 at ``start_s``."""
    if end_s is not None and end_s < start_s:
        raise InputError(f"time window: end {end_s!r} is before start {start_s!r}")
    lo = int(np.searchsorted(trace.arrival_s, start_s, side="left"))
    hi = len(trace) if end_s is None else int(np.searchsorted(trace.arrival_s, end_s, side="left"))
    out = trace.slice(lo, hi)
    if rebase and start_s:
        out = dataclasses.replace(out, arrival_s=out.arrival_s - start_s)
    return out


def trace_stats(trace: Trace) -> dict:
    """Summary figures: requests, span, mean rate, inter-arrival CV, per-column stats."""
    n = len(trace)
    arr = trace.arrival_s
    span = float(arr[-1] - arr[0]) if n else 0.0
    gaps = np.diff(arr)
    mean_gap = float(gaps.mean()) if gaps.size else float("nan")
    out = {
        "requests": n,
        "span_s": span,
        "mean_rate": n / span if span > 0 else float("nan"),
        "interarrival_cv": float(gaps.std() / mean_gap) if gaps.size and mean_gap > 0 else float("nan"),
        "columns": {},
    }
    for c, (_dtype, _lo, default) in _INT_COLUMNS.items():
        v = getattr(trace, c)
        if c != "request_id" and n and np.any(v != default):
            out["columns"][c] = {"mean": float(v.mean()), "median": float(np.median(v)),
                                 "max": int(v.max())}
    if trace.hash_offsets is not None and n:
        blocks = np.diff(trace.hash_offsets)
        out["columns"]["hash_blocks"] = {"mean": float(blocks.mean()), "median": float(np.median(blocks)),
                                         "max": int(blocks.max())}
    return out


# --------------------------------------------------------------------- public traces

PUBLIC_TRACES = {
    "azure-code": (
        "https://raw.githubusercontent.com/Azure/AzurePublicDataset/refs/heads/master/data/"
        "AzureLLMInferenceTrace_code.csv",
        "azure_llm_2023_code.csv",
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    ),
    "azure-conv": (
        "https://raw.githubusercontent.com/Azure/AzurePublicDataset/refs/heads/master/data/"
        "AzureLLMInferenceTrace_conv.csv",
        "azure_llm_2023_conv.csv",
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
    ),
    "mooncake-conversation": (
        "https://raw.githubusercontent.com/kvcache-ai/Mooncake/refs/heads/main/FAST25-release/traces/"
        "conversation_trace.jsonl",
        "mooncake_conversation.jsonl",
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
    ),
}
"""name -> (public URL, local file name, sha256). Azure data: CC-BY-4.0
("Azure LLM inference trace 2023, Microsoft Azure, CC-BY-4.0"); Mooncake: Apache-2.0."""


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_public_trace(name: str, dest_dir, *, url: str | None = None, timeout_s: float = 60.0) -> Path:
    """Download a public trace into ``dest_dir`` and verify its sha256.

    Returns the file's path; a file already there with the right checksum is kept.
    ``url`` overrides the public location (a mirror, or ``file://`` in tests).
    """
    if name not in PUBLIC_TRACES:
        raise InputError(f"trace {name!r}: unknown; choose one of {', '.join(PUBLIC_TRACES)}")
    default_url, filename, sha = PUBLIC_TRACES[name]
    url = url or default_url
    dest_dir = Path(dest_dir)
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{dest_dir}: cannot create directory: {e.strerror}") from None
    dest = dest_dir / filename
    if dest.is_file() and sha256_file(dest) == sha:
        return dest
    import urllib.error  # here: only downloads need the HTTP stack (and its import time)
    import urllib.request

    h = hashlib.sha256()
    with replaced_atomically(dest) as tmp:
        with open(tmp, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                    for block in iter(lambda: resp.read(1 << 20), b""):
                        h.update(block)
                        out.write(block)
            except (urllib.error.URLError, OSError, ValueError) as e:
                reason = getattr(e, "reason", None) or e
                raise InputError(f"{url}: download failed: {reason}") from None
        got = h.hexdigest()
        if got != sha:
            raise InputError(f"{url}: sha256 mismatch: expected {sha}, got {got}; the file was not kept")
    return dest
