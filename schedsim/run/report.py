"""Writing a run's outputs: requests.csv, summary.json and plots.

Every file is written to a temporary name and renamed into place, and summary.json
is written last, so an interrupted run never leaves a directory that looks complete.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from schedsim.files import replaced_atomically, write_json
from schedsim.core.results import STATUS_NAMES, SimResult


def _atomic(path: Path, write) -> None:
    with replaced_atomically(path) as tmp:
        write(tmp)


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
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = out_dir / "summary.json"
    summary_path.unlink(missing_ok=True)  # an old summary must not vouch for new files
    written = []
    table = request_table(result, request_id)
    path = out_dir / "requests.csv"
    _atomic(path, lambda tmp: pacsv.write_csv(table, tmp))
    written.append(path)
    if plot:
        from schedsim.run.plots import write_plots  # matplotlib only when asked for

        written += write_plots(out_dir, result, warmup_s, _atomic)
    write_json(summary_path, summary)
    written.append(summary_path)
    return written
