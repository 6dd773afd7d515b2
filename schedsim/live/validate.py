"""``schedsim validate``: predicted (a ``schedsim run`` directory) against measured (a
``schedsim live`` directory) for the same trace, policy and parameters.

Errors are in percent of the measured value, signed: ``(predicted - measured) /
measured * 100``, so +5 means the simulator predicts 5% more than was measured. The
latency distributions are compared with the two-sample Kolmogorov-Smirnov statistic
(the largest vertical gap between the two CDFs). When the simulation was replicated, the
summary's 95% intervals are reported next to the predictions, with whether the
measurement falls inside.

Several live runs of the same trace (``--live A --live B ...``) are one measurement: each
metric's measured value is the median over the runs, its error is against that median,
and the runs' range is reported with whether the prediction falls inside it. A single
live run on a shared machine can move its p99 by several percent from the next (on the
H200 here a median 6% between runs; experiments/fidelity/pooled.py), so the median of a
few is the steadier thing to predict. The KS statistic is then against all runs'
latencies pooled (for LLM runs, each of TTFT, TPOT and E2E).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from schedsim.errors import InputError

METRICS = (  # (key in validation.json, key in summary.json, label)
    ("p50", "p50_ms", "latency p50 (ms)"),
    ("p90", "p90_ms", "latency p90 (ms)"),
    ("p99", "p99_ms", "latency p99 (ms)"),
    ("p999", "p999_ms", "latency p99.9 (ms)"),
    ("mean", "mean_ms", "latency mean (ms)"),
    ("throughput", "throughput_rps", "throughput (req/s)"),
    ("mean_batch_size", "mean_batch_size", "mean batch size"),
)
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


def _load_dir(path: Path, what: str, numbers: tuple[str, ...] = ("arrival_s", "latency_ms")) -> tuple[dict, dict]:
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
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(requests_path, convert_options=pacsv.ConvertOptions(
            include_columns=[*numbers, "status"], column_types={k: "float64" for k in numbers}))
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors name the problem
        raise InputError(f"{requests_path}: cannot read it: {' '.join(str(exc).split())[:200]}") from exc
    cols = {k: table[k].to_numpy(zero_copy_only=False).astype(np.float64) for k in numbers}
    cols["status"] = np.asarray(table["status"].cast("string").to_pylist(), dtype=object)
    return summary, cols


def _check_same(sim: dict, live: dict, sim_cols: dict, live_cols: dict, sim_dir, live_dir) -> None:
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


def compare(sim: dict, live: dict, sim_cols: dict, live_cols: dict) -> dict:
    """The comparison as a dict (validation.json without the provenance)."""
    from scipy.stats import ks_2samp

    warmup = float(live.get("config", {}).get("warmup_s", 0.0) or 0.0)

    def latencies(cols):
        keep = (cols["arrival_s"] >= warmup - 1e-12) & (cols["status"] == "completed")
        return np.sort(cols["latency_ms"][keep].astype(np.float64))

    lat_sim, lat_live = latencies(sim_cols), latencies(live_cols)
    out: dict = {"metrics": {}}
    for key, skey, label in METRICS:
        p, m = sim.get(skey), live.get(skey)
        row = {"label": label, "predicted": p, "measured": m, "err_pct": err_pct(p, m)}
        ci = sim.get(f"{skey}_ci")
        if ci:
            row["predicted_ci"] = ci
            row["measured_in_ci"] = bool(m is not None and ci[0] <= m <= ci[1])
        out["metrics"][key] = row
        out[f"{key}_err_pct"] = row["err_pct"]
    if lat_sim.size and lat_live.size:
        ks = ks_2samp(lat_sim, lat_live)
        out["ks_stat"], out["ks_pvalue"] = float(ks.statistic), float(ks.pvalue)
    else:
        out["ks_stat"] = out["ks_pvalue"] = math.nan
    out["completed"] = {"predicted": int(lat_sim.size), "measured": int(lat_live.size)}
    for key in ("rejected", "failed", "unfinished"):
        out[key] = {"predicted": sim.get(key), "measured": live.get(key)}
    out["replications"] = int(sim.get("replications", 1) or 1)
    out["_latencies"] = (lat_sim, lat_live)
    return out


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


def pool_runs(reports: list[dict]) -> dict:
    """One comparison from several (:func:`compare` of the same prediction against each live
    run): every metric :func:`pooled_metric`, KS against the runs' latencies pooled."""
    first = reports[0]
    out: dict = {"metrics": {}, "live_runs": len(reports)}
    for key, _, _ in METRICS:
        row = out["metrics"][key] = pooled_metric([r["metrics"][key] for r in reports])
        out[f"{key}_err_pct"] = row["err_pct"]
    lat_sim = first["_latencies"][0]
    lat_live = np.sort(np.concatenate([r["_latencies"][1] for r in reports]))
    if lat_sim.size and lat_live.size:
        from scipy.stats import ks_2samp

        ks = ks_2samp(lat_sim, lat_live)
        out["ks_stat"], out["ks_pvalue"] = float(ks.statistic), float(ks.pvalue)
    else:
        out["ks_stat"] = out["ks_pvalue"] = math.nan
    out["completed"] = {"predicted": first["completed"]["predicted"],
                        "measured": int(np.median([r["completed"]["measured"] for r in reports]))}
    for key in ("rejected", "failed", "unfinished"):
        out[key] = {"predicted": first[key]["predicted"], "measured_runs": [r[key]["measured"] for r in reports]}
    out["replications"] = first["replications"]
    out["_latencies"] = (lat_sim, lat_live)
    return out


def compare_runs(sim_dir, live_dirs: list, load, compare_fn, pool_fn) -> tuple:
    """Load the prediction and each live run (``load(path, flag)``), check each replayed the
    same trace and settings, compare (``compare_fn``) and, for several runs, pool
    (``pool_fn``). Returns (sim, sim_cols, live, live_cols, report) with the last live run's
    summary and columns (the trace and settings are the same in all)."""
    sim, sim_cols = load(sim_dir, "--sim")
    reports = []
    for d in live_dirs:
        live, live_cols = load(d, "--live")
        _check_same(sim, live, sim_cols, live_cols, sim_dir, d)
        reports.append(compare_fn(sim, live, sim_cols, live_cols))
    report = reports[0] if len(reports) == 1 else pool_fn(reports)
    if len(reports) > 1:
        report["live_dirs"] = [str(d) for d in live_dirs]
    return sim, sim_cols, live, live_cols, report


def validate_dirs(sim_dir, live_dir, *, out=None, plot: bool = False) -> dict:
    """Compare a prediction with one live run (or several: ``live_dir`` a list, see the module
    docstring); write validation.json (and the plot) into ``out``, by default the (first)
    live directory; return the report."""
    live_dirs = [live_dir] if isinstance(live_dir, (str, Path)) else list(live_dir)
    if not live_dirs:
        raise InputError("--live: give at least one schedsim live output directory")
    # --- LLM runs (issue 6): TTFT/TPOT/E2E instead of request latency ---
    if _is_llm_dir(sim_dir) or any(_is_llm_dir(d) for d in live_dirs):
        from schedsim.live.llm_validate import validate_llm_dirs

        return validate_llm_dirs(sim_dir, live_dirs, out=out, plot=plot)
    # --- end LLM ---
    sim, sim_cols, live, live_cols, report = compare_runs(sim_dir, live_dirs, _load_dir, compare, pool_runs)
    live_dir = live_dirs[0]
    lat_sim, lat_live = report.pop("_latencies")
    report.update(sim_dir=str(sim_dir), live_dir=str(live_dir),
                  trace_requests=len(live_cols["arrival_s"]), arrivals_sha256=arrival_hash(live_cols["arrival_s"]),
                  policy=live.get("config", {}).get("policy"), params=live.get("config", {}).get("params"),
                  instances=live.get("config", {}).get("instances"),
                  warmup_s=live.get("config", {}).get("warmup_s"))
    out_dir = Path(out) if out is not None else Path(live_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from schedsim.files import write_json
    from schedsim.run.report import _atomic

    written = []
    if plot:
        written.append(_plot_cdfs(out_dir / "latency_cdf_validation.png", lat_sim, lat_live, report, _atomic))
    path = out_dir / "validation.json"
    written.append(path)
    report["written"] = [str(p) for p in written]
    write_json(path, report)
    return report


def _is_llm_dir(path) -> bool:
    """Whether an output directory holds an LLM run (its summary has ttft_p50_ms)."""
    try:
        return "ttft_p50_ms" in json.loads((Path(path) / "summary.json").read_text())
    except (OSError, ValueError):
        return False


def _plot_cdfs(path: Path, lat_sim: np.ndarray, lat_live: np.ndarray, report: dict, atomic) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for lat, label in ((lat_sim, "predicted (schedsim run)"), (lat_live, "measured (schedsim live)")):
        if lat.size:
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=label)
    ax.set(xlabel="latency (ms)", ylabel="fraction of requests",
           title=f"Latency CDF: KS = {report['ks_stat']:.3f}, p99 error {report['p99_err_pct']:+.1f}%")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)
    return path


def print_validation(report: dict) -> None:
    if report.get("kind") == "llm":
        from schedsim.live.llm_validate import print_llm_validation

        return print_llm_validation(report)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    runs = report.get("live_runs", 1)
    measured = f"the median of {runs} live runs" if runs > 1 else report["live_dir"]
    console.print(f"[bold]predicted {report['sim_dir']} vs measured {measured}[/bold]: "
                  f"{report['trace_requests']:,} requests, policy {report['policy']}, "
                  f"{report['instances']} instance(s)")
    table = Table(box=None, header_style="bold")
    columns = ("metric", "predicted", "measured", "error") + (("live runs' range",) if runs > 1 else ())
    for col in columns:
        table.add_column(col, justify="left" if col == "metric" else "right")

    def num(v, ci=None):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        text = f"{v:,.3f}"
        return text + (f"  [{ci[0]:,.3f}, {ci[1]:,.3f}]" if ci else "")

    for row in report["metrics"].values():
        e = row["err_pct"]
        cells = [row["label"], num(row["predicted"], row.get("predicted_ci")), num(row["measured"]),
                 "-" if not math.isfinite(e) else f"{e:+.1f}%"]
        if runs > 1:
            r = row.get("measured_range")
            inside = " (prediction inside)" if row.get("predicted_in_measured_range") else ""
            cells.append("-" if not r else f"{r[0]:,.3f} - {r[1]:,.3f}{inside}")
        table.add_row(*cells)
    console.print(table)
    console.print(f"KS statistic {report['ks_stat']:.4f} (p = {report['ks_pvalue']:.3g}); "
                  f"completed {report['completed']['predicted']:,} predicted, {report['completed']['measured']:,} measured")
    for path in report.get("written", []):
        console.print(f"wrote {path}")
