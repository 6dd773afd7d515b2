"""What request-level and LLM validation share: reading a run directory, checking that a
prediction and a live run replayed the same trace and settings, signed errors, pooling
several live runs into one measurement, and writing the report.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
from rich.console import Console
from rich.table import Table

from schedsim.errors import InputError
from schedsim.files import write_json

_SAME_CONFIG = ("policy", "params", "instances", "warmup_s")


def err_pct(predicted: float, measured: float) -> float:
    """Signed error of a prediction in percent of the measurement (NaN when undefined)."""
    if predicted is None or measured is None or not (math.isfinite(predicted) and math.isfinite(measured)) \
            or measured == 0:
        return math.nan
    return (predicted - measured) / measured * 100.0


def arrival_hash(arrival_s: np.ndarray) -> str:
    """Identity of a trace as replayed: SHA-256 of its arrival times rounded to the ns."""
    ns = np.rint(np.asarray(arrival_s, dtype=np.float64) * 1e9).astype("<i8")
    return hashlib.sha256(ns.tobytes()).hexdigest()[:16]


def load_run_dir(path: Path, what: str, numbers: tuple[str, ...] = ("arrival_s", "latency_ms")) -> tuple[dict, dict]:
    """(summary, columns of requests.csv) of a run directory; InputError when incomplete.

    ``numbers`` are read as float64 columns, beside ``status`` (LLM runs read TTFT/TPOT/E2E).
    """
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{what} {path}: no such directory")
    summary_path, requests_path = path / "summary.json", path / "requests.csv"
    for p in (summary_path, requests_path):
        if not p.is_file():
            raise InputError(f"{what} {path}: no {p.name} (not a finished schedsim run/live output directory)")
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{summary_path}: not valid JSON: {exc}") from exc
    _check_kind(path, what, summary)
    try:
        table = pacsv.read_csv(requests_path, convert_options=pacsv.ConvertOptions(
            include_columns=[*numbers, "status"], column_types={k: "float64" for k in numbers}))
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors name the problem
        raise InputError(f"{requests_path}: cannot read it: {' '.join(str(exc).split())[:200]}") from exc
    cols = {k: table[k].to_numpy(zero_copy_only=False).astype(np.float64) for k in numbers}
    cols["status"] = np.asarray(table["status"].cast("string").to_pylist(), dtype=object)
    return summary, cols


def is_simulation(path, summary: dict) -> bool:
    """Whether ``path`` (with its ``summary``) is a schedsim run's output: no live.json, and a
    config that records replications, which only schedsim run does."""
    config = summary.get("config", {}) if isinstance(summary, dict) else {}
    return not _is_live(Path(path), summary) and "replications" in config


def _is_live(path: Path, summary: dict) -> bool:
    config = summary.get("config", {}) if isinstance(summary, dict) else {}
    return config.get("driver") == "live" or (path / "live.json").is_file()


def _check_kind(path: Path, what: str, summary: dict) -> None:
    """InputError when ``--sim`` names a live run's directory, or either side a partial run."""
    if summary.get("partial"):
        raise InputError(f"{what} {path}: the live run is partial ({summary.get('partial_reason', 'stopped early')}); "
                         "validate needs a complete run")
    if what == "--sim" and _is_live(path, summary):
        raise InputError(f"--sim {path}: a schedsim live output directory (it has live.json); "
                         "--sim takes the directory of a schedsim run")


def check_same(sim: dict, live: dict, sim_cols: dict, live_cols: dict, sim_dir, live_dir) -> None:
    """InputError unless ``live`` is complete and replayed the trace and settings ``sim`` did."""
    if live.get("partial"):
        raise InputError(f"--live {live_dir}: the live run is partial ({live.get('partial_reason', 'stopped early')}); "
                         "validate needs a complete run")
    n_sim, n_live = len(sim_cols["arrival_s"]), len(live_cols["arrival_s"])
    h_sim, h_live = arrival_hash(sim_cols["arrival_s"]), arrival_hash(live_cols["arrival_s"])
    if n_sim != n_live or h_sim != h_live:
        raise InputError(f"--sim {sim_dir} and --live {live_dir} replayed different traces "
                         f"({n_sim:,} requests, arrivals {h_sim} vs {n_live:,}, {h_live})")
    cs, cl = sim.get("config", {}), live.get("config", {})
    for key in _SAME_CONFIG:
        if key in cs and key in cl and cs[key] != cl[key]:
            raise InputError(f"--sim {sim_dir} and --live {live_dir} differ in {key}: "
                             f"{json.dumps(cs[key], sort_keys=True)} vs {json.dumps(cl[key], sort_keys=True)}")


def pooled_metric(rows: list[dict], err=None) -> dict:
    """One metric's row from its rows against several live runs (the same prediction in
    each): the measured value becomes the median over the runs, the error is against it
    (``err(predicted, measured)``, default :func:`err_pct`), plus the runs' values
    (``measured_runs``), their range and whether the prediction lies inside it."""
    err = err or err_pct
    values = [r["measured"] for r in rows]
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    row = dict(rows[0])
    row.pop("measured_in_ci", None)
    m = float(np.median(finite)) if finite else None
    p = row["predicted"]
    row.update(measured=m, measured_runs=values, err_pct=err(p, m),
               measured_range=[min(finite), max(finite)] if finite else None)
    row["predicted_in_measured_range"] = bool(finite and p is not None and min(finite) <= p <= max(finite))
    if row.get("predicted_ci") and m is not None:
        row["measured_in_ci"] = bool(row["predicted_ci"][0] <= m <= row["predicted_ci"][1])
    return row


def compare_runs(sim_dir, live_dirs: list, load, compare_fn, pool_fn) -> tuple:
    """Load the prediction and each live run (``load(path, flag)``), check each replayed the
    same trace and settings, compare (``compare_fn``) and, for several runs, pool
    (``pool_fn``). Returns (sim, sim_cols, live, live_cols, report) with the last live run's
    summary and columns (the trace and settings are the same in all)."""
    sim, sim_cols = load(sim_dir, "--sim")
    reports, simulated = [], []
    for d in live_dirs:
        live, live_cols = load(d, "--live")
        simulated.append(is_simulation(d, live))
        if all(simulated) and len(simulated) == len(live_dirs):
            # A prediction may stand beside live runs (pooling checks), never alone.
            raise InputError(f"--live {live_dirs[0]}: a schedsim run output directory (a simulation, no "
                             "live.json); --live takes the directory of a schedsim live run")
        check_same(sim, live, sim_cols, live_cols, sim_dir, d)
        reports.append(compare_fn(sim, live, sim_cols, live_cols))
    report = reports[0] if len(reports) == 1 else pool_fn(reports)
    if len(reports) > 1:
        report["live_dirs"] = [str(d) for d in live_dirs]
    return sim, sim_cols, live, live_cols, report


def is_llm_dir(path) -> bool:
    """Whether an output directory holds an LLM run (its summary has ttft_p50_ms)."""
    try:
        return "ttft_p50_ms" in json.loads((Path(path) / "summary.json").read_text())
    except (OSError, ValueError):
        return False


def write_report(report: dict, out, live_dir, plot=None) -> dict:
    """Write validation.json (after ``plot(out_dir)``'s figure, when given) into ``out``, by
    default the (first) live directory; the report lists what was written."""
    out_dir = Path(out) if out is not None else Path(live_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [plot(out_dir)] if plot is not None else []
    path = out_dir / "validation.json"
    written.append(path)
    report["written"] = [str(p) for p in written]
    write_json(path, report)
    return report


def report_table(report: dict, detail: str, columns: tuple) -> tuple[Console, Table, int]:
    """Print a validation report's heading (``detail`` after the policy) and return the
    console, an empty table with ``columns`` (and the live runs' range, for several runs)
    and the number of live runs."""
    console = Console()
    runs = report.get("live_runs", 1)
    measured = f"the median of {runs} live runs" if runs > 1 else report["live_dir"]
    console.print(f"[bold]predicted {report['sim_dir']} vs measured {measured}[/bold]: "
                  f"{report['trace_requests']:,} requests, policy {report['policy']}, {detail}")
    table = Table(box=None, header_style="bold")
    for col in columns + (("live runs' range",) if runs > 1 else ()):
        table.add_column(col, justify="left" if col == "metric" else "right")
    return console, table, runs
