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


LIVE_SPREAD_Z = 1.6449
"""z of a 90% two-sided normal range: the live runs' spread is stated as 1.645 standard
deviations, the half-width a 90% band would need to cover them."""


def band_fields(row: dict, summary: dict, key: str) -> None:
    """Add the prediction band of ``summary[key]`` to a metric's ``row`` (``predicted_band``
    and whether the measurement lies in it), when the run has one."""
    lo, hi = summary.get(f"{key}_lo"), summary.get(f"{key}_hi")
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float))):
        return
    m = row.get("measured")
    row["predicted_band"] = [lo, hi]
    row["band_level"] = (summary.get("band") or {}).get("level")
    row["measured_in_band"] = bool(m is not None and math.isfinite(m) and lo <= m <= hi)


def band_against_runs(row: dict, finite: list[float]) -> None:
    """For a pooled ``row`` with a band: which live runs it covers, its coverage, its
    half-width and the live runs' own spread, both in percent of the live median."""
    band, m = row.get("predicted_band"), row.get("measured")
    if not band or m is None or not finite:
        return
    lo, hi = band
    row["runs_in_band"] = [bool(lo <= v <= hi) for v in finite]
    row["band_coverage"] = float(np.mean(row["runs_in_band"]))
    row["measured_in_band"] = bool(lo <= m <= hi)
    scale = abs(m) if m else math.nan
    row["band_half_width_pct"] = (hi - lo) / 2 / scale * 100
    row["live_half_range_pct"] = (max(finite) - min(finite)) / 2 / scale * 100
    if len(finite) > 1:
        row["live_spread_pct"] = LIVE_SPREAD_Z * float(np.std(finite, ddof=1)) / scale * 100
        row["band_to_live_spread"] = (row["band_half_width_pct"] / row["live_spread_pct"]
                                      if row["live_spread_pct"] > 0 else math.inf)


def band_coverage(metrics: dict) -> dict | None:
    """Over every metric with a band: the share of (metric, live run) pairs inside it, the
    share of live medians inside, and the median band half-width over the live spread."""
    rows = [r for r in metrics.values() if r.get("runs_in_band") is not None]
    if not rows:
        return None
    runs = [v for r in rows for v in r["runs_in_band"]]
    ratios = [r["band_to_live_spread"] for r in rows if math.isfinite(r.get("band_to_live_spread", math.nan))]
    return {"level": rows[0].get("band_level"), "runs_covered": float(np.mean(runs)),
            "medians_covered": float(np.mean([r["measured_in_band"] for r in rows])),
            "median_half_width_over_live_spread": float(np.median(ratios)) if ratios else None,
            "spread_definition": f"the live runs' standard deviation x {LIVE_SPREAD_Z} (a 90% normal half-range), "
                                 "in percent of their median"}


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
    band_against_runs(row, finite)
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
        coverage = band_coverage(report["metrics"])
        if coverage is not None:
            report["band"] = coverage
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
    banded = any(r.get("predicted_band") for r in report["metrics"].values())
    for col in columns + (("live runs' range",) if runs > 1 else ()) + (("band (runs inside)",) if banded else ()):
        table.add_column(col, justify="left" if col == "metric" else "right")
    return console, table, runs


def band_cell(row: dict, num=lambda v: f"{v:,.3f}") -> list[str]:
    """The band column of a validation table row ([] when the report has no band at all)."""
    band = row.get("predicted_band")
    if not band:
        return ["-"]
    inside = row.get("runs_in_band")
    count = (f"{sum(inside)}/{len(inside)}" if inside is not None
             else ("inside" if row.get("measured_in_band") else "outside"))
    return [f"{num(band[0])} - {num(band[1])} ({count})"]


def print_band_line(console, report: dict) -> None:
    """The band's coverage of the live runs, and its width against their spread."""
    b = report.get("band")
    if not b:
        return
    ratio = b.get("median_half_width_over_live_spread")
    console.print(f"band ({b['level']:.0%}): covers {b['runs_covered']:.0%} of the live runs' figures and "
                  f"{b['medians_covered']:.0%} of their medians; median half-width "
                  + (f"{ratio:.2f}x" if ratio is not None else "-")
                  + " the live runs' own spread (1.645 standard deviations)", highlight=False, soft_wrap=True)
