"""Writing a run's outputs: requests.csv, summary.json and plots.

Every file is written to a temporary name and renamed into place, and summary.json
is written last, so an interrupted run never leaves a directory that looks complete.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from schedsim.core.results import STATUS_NAMES, SimResult
from schedsim.run.csv_text import END, Rows, Unsupported
from schedsim.files import write_atomically, write_json

FORMATS = ("csv", "parquet")
"""How per-request tables are written: CSV (the default) or Parquet."""

_CHUNK_ROWS = 1 << 17  # rows formatted per task when a CSV is written by several threads
# The same by csv_text: 16,384 rows make 1.6 MB of units and 1.3 MB of text, which stay in the
# caches until written and reuse the heap's freed blocks. Chunks of 65,536 rows (8 MB of buffers
# each, several in flight) grew the heap by about 60 MB of fresh pages while writing: 0.27-0.78 s
# of system time in page faults for a 2,000,000-request requests.csv, against 0.07 s.
_TEXT_CHUNK_ROWS = 1 << 14


def arrow(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A numeric column as an Arrow array on the same memory, null where not ``valid``.
    ``pa.array`` of a numpy array imports pandas (0.6 s) to look for a pandas type."""
    values = np.ascontiguousarray(values)
    bitmap, nulls = None, 0
    if valid is not None and not valid.all():
        bitmap, nulls = pa.py_buffer(np.packbits(valid, bitorder="little")), int(len(valid) - valid.sum())
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [bitmap, pa.py_buffer(values)],
                                 null_count=nulls)


def strings(values) -> pa.Array:
    """Python strings as an Arrow string array (``pa.array`` of a list imports pandas too)."""
    data = [v.encode() for v in values]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in data])]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def request_table(result: SimResult, request_id: np.ndarray, start: int = 0, stop: int | None = None) -> pa.Table:
    """The per-request table with seconds and milliseconds, nulls for 'did not happen'
    (rows ``start`` to ``stop``: all by default)."""
    rows = slice(start, stop)
    arrival, start_ns, end_ns = result.requests.arrival_ns[rows], result.start_ns[rows], result.end_ns[rows]
    started = start_ns >= 0
    ended = end_ns >= 0
    return pa.table({
        "request_id": arrow(request_id[rows]),
        "arrival_s": arrow(arrival / 1e9),
        "start_s": arrow(start_ns / 1e9, started),
        "end_s": arrow(end_ns / 1e9, ended),
        "latency_ms": arrow((end_ns - arrival) / 1e6, ended & started),
        "queue_ms": arrow((start_ns - arrival) / 1e6, started),
        "batch_size": arrow(result.batch_size[rows], started),
        "instance": arrow(result.instance[rows], started),
        "status": pa.DictionaryArray.from_arrays(arrow(result.status[rows].astype(np.int32)), strings(STATUS_NAMES)),
    })


class TableParts:
    """A table built a slice at a time, for writing: ``num_rows`` and ``slice(offset, length)``
    as :class:`pyarrow.Table` has them, so that only the slices being written are in memory;
    ``text(start, stop)``, when given, makes those rows' CSV text without pyarrow
    (:mod:`schedsim.run.csv_text`, which raises ``Unsupported`` for a slice it cannot make)."""

    def __init__(self, num_rows: int, build, text=None, text_threads: int = 1):
        """``text_threads``: how many threads may run ``text`` at once to gain time (more than
        one only where it leaves the GIL, as the C rows do)."""
        self.num_rows, self._build, self.text, self.text_threads = num_rows, build, text, text_threads

    def slice(self, offset: int = 0, length: int | None = None) -> pa.Table:
        stop = self.num_rows if length is None else min(offset + length, self.num_rows)
        return self._build(offset, stop)


try:
    from schedsim.run._csv_rows import request_rows as _c_request_rows  # built by setup.py where C compiles
except ImportError:
    _c_request_rows = None

_QUOTED_STATUS = tuple(f'"{name}"'.encode() for name in STATUS_NAMES)


def request_rows(result: SimResult, request_id: np.ndarray, start: int, stop: int) -> bytes | bytearray:
    """Rows ``start`` to ``stop`` of :func:`request_table` as CSV text, the bytes pyarrow writes
    (the columns from the integer nanoseconds), made in C where the extension is built, else in
    numpy (:func:`request_rows_numpy`); raises ``Unsupported`` for rows with a value whose text
    is pyarrow's to make."""
    if _c_request_rows is None:
        return request_rows_numpy(result, request_id, start, stop)
    rows = slice(start, stop)
    columns = (request_id[rows], result.requests.arrival_ns[rows], result.start_ns[rows], result.end_ns[rows],
               result.batch_size[rows], result.instance[rows], result.status[rows])
    text = _c_request_rows(*(np.ascontiguousarray(c, dtype=np.int64) for c in columns), _QUOTED_STATUS)
    if text is None:
        raise Unsupported("a value csv_text does not write")
    return text


def request_rows_numpy(result: SimResult, request_id: np.ndarray, start: int, stop: int) -> bytearray:
    """:func:`request_rows` in numpy (:mod:`schedsim.run.csv_text`). The requests of a batch
    share its start, end, size, instance and status: those are made once per run of equal rows."""
    rows = slice(start, stop)
    arrival, start_ns, end_ns = result.requests.arrival_ns[rows], result.start_ns[rows], result.end_ns[rows]
    size, instance, status = result.batch_size[rows], result.instance[rows], result.status[rows]
    n = len(arrival)
    new_run = np.ones(n, bool)
    for column in (start_ns, end_ns, size, instance, status):
        new_run[1:] &= column[1:] == column[:-1]
    np.logical_not(new_run, out=new_run)
    new_run[:1] = True
    firsts = np.flatnonzero(new_run)
    run_of_row = np.cumsum(new_run) - 1
    started, ended = start_ns >= 0, end_ns >= 0
    both = ended & started
    started, ended, both = (None if m.all() else m for m in (started, ended, both))
    run_started, run_ended = (None if m is None else m[firsts] for m in (started, ended))
    times = Rows(len(firsts), first=False)
    times.decimal(start_ns[firsts], 9, run_started)
    times.decimal(end_ns[firsts], 9, run_ended)
    batch = Rows(len(firsts), first=False)
    batch.integer(size[firsts], run_started)
    batch.integer(instance[firsts], run_started)
    batch.labels(status[firsts], STATUS_NAMES)
    text = Rows(n)
    text.integer(request_id[rows])
    text.decimal(arrival, 9)
    text.repeat(times, run_of_row)
    text.decimal(end_ns - arrival, 6, both)
    text.decimal(start_ns - arrival, 6, started)
    text.repeat(batch, run_of_row)
    return text.text()


def write_csv(table: pa.Table | TableParts, path) -> None:
    """``table`` as CSV, the bytes pyarrow's writer gives, made by chunks of rows and written in
    order as they come: by ``table.text`` where it has one (pyarrow's writer took 1.1 s of CPU
    for 2,000,000 requests), on one thread while this one writes, else by pyarrow (which
    formats on one thread) on every core."""
    text = table.text if isinstance(table, TableParts) else None
    chunk_rows = _TEXT_CHUNK_ROWS if text is not None else _CHUNK_ROWS
    # csv_text in numpy on one thread: much of its work (bytearray.translate, the Python between
    # numpy calls) holds the GIL, and a second thread added CPU without saving wall time. --out
    # of a 2,000,000-request run in turn (12 rounds, load 2.1-2.5): 1.31 s of CPU against 1.43 s
    # with a thread per core, wall 1.46 s against 1.47 s (medians). The C rows leave the GIL.
    cores = table.text_threads if text is not None else os.cpu_count() or 1
    workers = min(cores, -(-table.num_rows // chunk_rows))
    if workers <= 1 and text is None:
        pacsv.write_csv(table.slice(0, table.num_rows), path)
        return

    def chunk(start: int):
        # Each chunk's rows each begin with a newline (csv_text.Rows): pyarrow's end with one.
        if text is not None:
            try:
                return [text(start, min(start + chunk_rows, table.num_rows))]
            except Unsupported:
                pass  # a value whose text is pyarrow's to make: this chunk by pyarrow
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table.slice(start, chunk_rows), sink, pacsv.WriteOptions(include_header=False))
        return [b"\n", memoryview(sink.getvalue())[:-1]]

    starts = iter(range(0, table.num_rows, chunk_rows))
    with open(path, "wb") as out, ThreadPoolExecutor(max(workers, 1)) as pool:
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table.slice(0, 0), sink)  # the header alone
        out.write(memoryview(sink.getvalue())[:-1])
        # At most two chunks per thread in memory: the file is written as they come, in order.
        pending = [pool.submit(chunk, start) for start in islice(starts, 2 * max(workers, 1))]
        while pending:
            out.writelines(pending.pop(0).result())
            start = next(starts, None)
            if start is not None:
                pending.append(pool.submit(chunk, start))
        out.write(END)


def write_table(table: pa.Table | TableParts, path, fmt: str = "csv") -> None:
    if fmt == "csv":
        write_csv(table, path)
        return
    import pyarrow.parquet as pq  # lazy: only for --format parquet

    part = table.slice(0, _CHUNK_ROWS)
    # Dictionary pages only for text: tried on 2,000,000 distinct floats they cost 3x the CPU
    # of the whole write and save nothing.
    text = [f.name for f in part.schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]
    with pq.ParquetWriter(path, part.schema, use_dictionary=text) as writer:
        writer.write_table(part)
        for start in range(_CHUNK_ROWS, table.num_rows, _CHUNK_ROWS):
            writer.write_table(table.slice(start, _CHUNK_ROWS))


def _request_parts(result: SimResult, request_id: np.ndarray) -> TableParts:
    return TableParts(len(result.requests), lambda start, stop: request_table(result, request_id, start, stop),
                      lambda start, stop: request_rows(result, request_id, start, stop),
                      text_threads=(os.cpu_count() or 1) if _c_request_rows is not None else 1)


class RequestsWriter:
    """requests.csv (or .parquet) written on a thread of its own from the moment a run's result
    exists, while the run goes on to its summary and capacity (summarize only reads the result):
    :func:`write_outputs` joins it before summary.json; a run that fails instead calls
    :meth:`abandon`, which waits for it and removes what it wrote."""

    def __init__(self, out_dir, result: SimResult, request_id: np.ndarray, fmt: str = "csv"):
        out_dir = _run_dir_ready(out_dir, fmt)
        self.path = out_dir / table_file_name("requests.csv", fmt)
        table = _request_parts(result, request_id)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, args=(table, fmt), name="schedsim-requests-writer")
        self._thread.start()

    def _write(self, table, fmt) -> None:
        try:
            write_atomically(self.path, lambda tmp: write_table(table, tmp, fmt))
        except BaseException as exc:  # handed to the run's thread by result()
            self._error = exc

    def result(self) -> Path:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.path

    def abandon(self) -> None:
        self._thread.join()
        self.path.unlink(missing_ok=True)


def write_outputs(out_dir: Path, result: SimResult, request_id: np.ndarray, summary: dict,
                  plot: bool = False, warmup_s: float = 0.0, fmt: str = "csv",
                  requests_writer: RequestsWriter | None = None) -> list[Path]:
    """Write DIR/requests.csv (or .parquet), optional plots, then DIR/summary.json; return the paths.
    ``requests_writer``: the table is already being written by it (see :class:`RequestsWriter`)."""
    def plots(out_dir):
        from schedsim.run.plots import write_plots  # lazy: matplotlib only when asked for

        return write_plots(out_dir, result, warmup_s, write_atomically, summary)

    if requests_writer is not None:
        return write_run_dir(out_dir, [], summary, plots if plot else None, fmt, written=[requests_writer.result()])
    return write_run_dir(out_dir, [("requests.csv", _request_parts(result, request_id))], summary,
                         plots if plot else None, fmt)


def table_file_name(name: str, fmt: str) -> str:
    return name if fmt == "csv" else Path(name).with_suffix(".parquet").name


def _run_dir_ready(out_dir, fmt: str) -> Path:
    """The run directory, created, with no summary.json: an old summary must not vouch for new files."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt: {fmt!r} is not one of {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").unlink(missing_ok=True)
    return out_dir


def write_run_dir(out_dir, tables, summary: dict, plots=None, fmt: str = "csv", written=()) -> list[Path]:
    """Write each ``(name, table)`` of ``tables`` (a pyarrow table or :class:`TableParts`) as a CSV
    (``fmt`` "parquet": as NAME.parquet),
    then ``plots(out_dir)``'s figures (when given), then summary.json, last; return the paths written
    (after ``written``, files of this run already in place)."""
    out_dir = _run_dir_ready(out_dir, fmt)
    summary_path = out_dir / "summary.json"
    written = list(written)
    for name, table in tables:
        path = out_dir / table_file_name(name, fmt)
        write_atomically(path, lambda tmp, table=table: write_table(table, tmp, fmt))
        written.append(path)
    if plots is not None:
        written += plots(out_dir)
    write_json(summary_path, summary)
    written.append(summary_path)
    return written
