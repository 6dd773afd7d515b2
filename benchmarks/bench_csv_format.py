"""What writing requests.csv costs: pyarrow's writer column by column, the float text made other
ways, and schedsim's own writer (schedsim.run.csv_text), which ``--out`` uses.

    python benchmarks/bench_csv_format.py           # 2,000,000 rows, about 40 s

The per-request table of a 2,000,000-request ``dynamic`` run (``schedsim run --out``) as
``schedsim.run.report`` builds it, in a process whose memory is set up as ``schedsim run``
sets its own (``prepare_run_process``). Timed by CPU time (user + system of this process), best
of ``--repeat``, on one chunk of rows at a time as the writer formats them:

- pyarrow's CSV writer on the chunk (what ``--out`` ran until csv_text), and the same writer on
  nine int64 columns (its cost beyond formatting the values);
- pyarrow's cast of each column to text (the writer's own formatting step), float64 and
  integer columns apart;
- two ways to make the float text from the integer nanoseconds the columns come from, each
  checked to give the same bytes as pyarrow's cast of the float: integer and fraction
  digits through pyarrow.compute (cast the parts to text, strip the fraction's trailing
  zeros, join them with "."), and a decimal128 column on the same integers cast to text
  with its trailing zeros stripped;
- schedsim's rows (``report.request_rows``, chunks of ``report._TEXT_CHUNK_ROWS``: in C where
  the extension is built), and the numpy rows of csv_text (``report.request_rows_numpy``, what
  runs without it), each checked byte for byte against pyarrow's writer on every row, and
  ``report.write_csv`` of the whole file into a temporary directory (threads and the write
  included).

Writes benchmarks/results/bench_csv_format.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CHUNK = 1 << 17


def best_cpu(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def digits_via_compute(k: np.ndarray, d: int) -> pa.Array:
    """Text of k / 10**d (k >= 0 integers) from integer casts: the shortest text for these values."""
    p = 10 ** d
    ip, fr = np.divmod(k, p)
    frac = pc.utf8_slice_codeunits(pc.utf8_rtrim(pc.cast(pa.array(fr + p), pa.string()), characters="0"), start=1)
    frac = pc.if_else(pa.array(fr == 0), pa.scalar(None, pa.string()), frac)
    return pc.binary_join_element_wise(pc.cast(pa.array(ip), pa.string()), frac, ".", null_handling="skip")


def digits_via_decimal(k: np.ndarray, d: int) -> pa.Array:
    """The same text from a decimal128 column with scale d on the same integers."""
    words = np.empty((len(k), 2), np.int64)
    words[:, 0], words[:, 1] = k, k >> 63
    dec = pa.Array.from_buffers(pa.decimal128(38, d), len(k), [None, pa.py_buffer(words)])
    return pc.utf8_rtrim(pc.utf8_rtrim(pc.cast(dec, pa.string()), characters="0"), characters=".")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_csv_format.json")
    args = ap.parse_args()
    from schedsim.cli.main import prepare_run_process

    # Memory as `schedsim run` sets its own: freed blocks reused (each chunk's buffer would
    # otherwise be fresh pages), numpy's arrays in ordinary pages (numpy is loaded already).
    prepare_run_process()
    np._core.multiarray._set_madvise_hugepage(os.environ["NUMPY_MADVISE_HUGEPAGE"] != "0")

    from schedsim.core.policy import Requests
    from schedsim.core.simulate import simulate
    from schedsim.cost.model import CostModel
    from schedsim.cost.profile import default_profile_path, load_profile
    from schedsim.registry import build_policy
    from schedsim.run import report as run_report
    from schedsim.run.report import request_table

    tmp = Path(tempfile.mkdtemp(prefix="bench-csv-"))
    trace_path = tmp / "trace.csv"
    import subprocess

    subprocess.run([sys.executable, "-m", "schedsim.cli.main", "trace", "gen", "--seed", "1", "--arrival", "poisson",
                    "--rate", "12205.445", "--seq-len", "fixed:128", "--n", str(args.n), "--out", str(trace_path)],
                   check=True, stdout=subprocess.DEVNULL)
    from schedsim.traces.io import load_trace

    trace = load_trace(trace_path)
    requests = Requests.from_trace(trace)
    result = simulate(requests, build_policy("dynamic", {"max_batch_size": 64, "max_queue_delay_us": 1000}),
                      CostModel.from_profile(load_profile(default_profile_path())), seed=1)
    chunks = range(0, args.n, CHUNK)
    tables = [request_table(result, trace.request_id, s, s + CHUNK) for s in chunks]
    floats = [f.name for f in tables[0].schema if pa.types.is_floating(f.type)]
    ints = [f.name for f in tables[0].schema if pa.types.is_integer(f.type)]

    def writer():
        for t in tables:
            pacsv.write_csv(t, pa.BufferOutputStream(), pacsv.WriteOptions(include_header=False))

    int_tables = [pa.table({f.name: pa.array(np.arange(len(t), dtype=np.int64)) for f in t.schema}) for t in tables]

    def writer_ints():
        for t in int_tables:
            pacsv.write_csv(t, pa.BufferOutputStream(), pacsv.WriteOptions(include_header=False))

    text_rows = run_report._TEXT_CHUNK_ROWS
    text_chunks = range(0, args.n, text_rows)

    def rows_by(make):
        def text():
            return [make(result, trace.request_id, s, min(s + text_rows, args.n)) for s in text_chunks]
        return text

    text, text_numpy = rows_by(run_report.request_rows), rows_by(run_report.request_rows_numpy)
    sink = pa.BufferOutputStream()
    for t in tables:
        pacsv.write_csv(t, sink, pacsv.WriteOptions(include_header=False))
    theirs = sink.getvalue().to_pybytes()
    for way in (text, text_numpy):
        # The rows each begin with a newline: the same bytes as the writer's, shifted by one.
        ours = b"".join(bytes(c) for c in way())
        assert ours[1:] + b"\n" == theirs, "schedsim's rows differ from pyarrow's writer"
        del ours
    del theirs, sink
    parts = run_report.TableParts(args.n, lambda a, b: request_table(result, trace.request_id, a, b),
                                  lambda a, b: run_report.request_rows(result, trace.request_id, a, b),
                                  text_threads=(os.cpu_count() or 1) if run_report._c_request_rows else 1)

    def whole_file():
        run_report.write_csv(parts, tmp / "requests.csv")
        (tmp / "requests.csv").unlink()

    def cast(names):
        def go():
            for t in tables:
                for name in names:
                    pc.cast(t.column(name), pa.string())
        return go

    # The float columns' integer nanoseconds, as request_table divides them (all present here).
    arrival, end = result.requests.arrival_ns, result.end_ns
    ns_cols = {"arrival_s": (arrival, 9), "end_s": (end, 9), "latency_ms": (end - arrival, 6)}
    for name, (k, d) in ns_cols.items():
        for s in chunks[:4]:
            want = pc.cast(pa.array(k[s:s + CHUNK] / 10 ** d), pa.string())
            for way in (digits_via_compute, digits_via_decimal):
                assert way(k[s:s + CHUNK], d).equals(want), (name, way.__name__)

    def other(way):
        def go():
            for s in chunks:
                for k, d in ns_cols.values():
                    way(k[s:s + CHUNK], d)
        return go

    load0 = os.getloadavg()[0]
    values_float = args.n * len(floats)
    timings = {
        "csv_writer_all_columns_s": best_cpu(writer, args.repeat),
        "csv_writer_9_int64_columns_s": best_cpu(writer_ints, args.repeat),
        "csv_text_all_columns_s": best_cpu(text, args.repeat),
        "csv_text_numpy_all_columns_s": best_cpu(text_numpy, args.repeat),
        "csv_text_write_csv_file_s": best_cpu(whole_file, args.repeat),
        "cast_float_columns_s": best_cpu(cast(floats), args.repeat),
        "cast_integer_columns_s": best_cpu(cast(ints), args.repeat),
        "ns_to_text_via_compute_3_columns_s": best_cpu(other(digits_via_compute), args.repeat),
        "ns_to_text_via_decimal_3_columns_s": best_cpu(other(digits_via_decimal), args.repeat),
    }
    report = {"benchmark": "bench_csv_format", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": args.n,
              "chunk_rows": CHUNK, "csv_text_chunk_rows": text_rows, "c_rows": run_report._c_request_rows is not None, "float_columns": floats, "integer_columns": ints, "pyarrow": pa.__version__,
              "loadavg_1m_before": load0, "loadavg_1m_after": os.getloadavg()[0], "cpu": timings,
              "ns_per_value": {
                  "csv_writer_per_row": timings["csv_writer_all_columns_s"] / args.n * 1e9,
                  "csv_writer_9_int64_per_row": timings["csv_writer_9_int64_columns_s"] / args.n * 1e9,
                  "csv_text_per_row": timings["csv_text_all_columns_s"] / args.n * 1e9,
                  "csv_text_numpy_per_row": timings["csv_text_numpy_all_columns_s"] / args.n * 1e9,
                  "csv_text_write_csv_per_row": timings["csv_text_write_csv_file_s"] / args.n * 1e9,
                  "cast_float": timings["cast_float_columns_s"] / values_float * 1e9,
                  "cast_integer": timings["cast_integer_columns_s"] / (args.n * len(ints)) * 1e9,
                  "via_compute": timings["ns_to_text_via_compute_3_columns_s"] / (args.n * 3) * 1e9,
                  "via_decimal": timings["ns_to_text_via_decimal_3_columns_s"] / (args.n * 3) * 1e9}}
    for k, v in timings.items():
        print(f"{k:40} {v:7.3f} s CPU")
    for k, v in report["ns_per_value"].items():
        print(f"{k:40} {v:7.1f} ns")
    print(f"load average {load0:.2f} -> {report['loadavg_1m_after']:.2f}; results in {args.out}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
