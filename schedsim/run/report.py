"""Writing a run's outputs: requests.csv, summary.json and plots.

Every file is written to a temporary name and renamed into place, and summary.json
is written last, so an interrupted run never leaves a directory that looks complete.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from schedsim.core.results import STATUS_NAMES, SimResult
from schedsim.files import write_atomically, write_json


def request_table(result: SimResult, request_id: np.ndarray) -> pa.Table:
    """The per-request table with seconds and milliseconds, nulls for 'did not happen'."""
    req = result.requests
    started = result.start_ns >= 0
    ended = result.end_ns >= 0
    arrival_s = req.arrival_ns / 1e9

    def masked(values, mask):
        return pa.array(values, mask=~mask)

    return pa.table({
        "request_id": request_id,
        "arrival_s": arrival_s,
        "start_s": masked(result.start_ns / 1e9, started),
        "end_s": masked(result.end_ns / 1e9, ended),
        "latency_ms": masked((result.end_ns - req.arrival_ns) / 1e6, ended & started),
        "queue_ms": masked((result.start_ns - req.arrival_ns) / 1e6, started),
        "batch_size": masked(result.batch_size, started),
        "instance": masked(result.instance, started),
        "status": pa.DictionaryArray.from_arrays(pa.array(result.status.astype(np.int32)),
                                                 pa.array(STATUS_NAMES)),
    })


def write_outputs(out_dir: Path, result: SimResult, request_id: np.ndarray, summary: dict,
                  plot: bool = False, warmup_s: float = 0.0) -> list[Path]:
    """Write DIR/requests.csv, optional plots, then DIR/summary.json; return the paths."""
    def plots(out_dir):
        from schedsim.run.plots import write_plots  # lazy: matplotlib only when asked for

        return write_plots(out_dir, result, warmup_s, write_atomically)

    return write_run_dir(out_dir, [("requests.csv", request_table(result, request_id))], summary,
                         plots if plot else None)


def write_run_dir(out_dir, tables, summary: dict, plots=None) -> list[Path]:
    """Write each ``(name, pyarrow table)`` of ``tables`` as a CSV, then ``plots(out_dir)``'s
    figures (when given), then summary.json, last; return the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = out_dir / "summary.json"
    summary_path.unlink(missing_ok=True)  # an old summary must not vouch for new files
    written = []
    for name, table in tables:
        path = out_dir / name
        write_atomically(path, lambda tmp, table=table: pacsv.write_csv(table, tmp))
        written.append(path)
    if plots is not None:
        written += plots(out_dir)
    write_json(summary_path, summary)
    written.append(summary_path)
    return written
