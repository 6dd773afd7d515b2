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

import math
from pathlib import Path

import numpy as np

from schedsim.errors import InputError
from schedsim.files import write_atomically
from schedsim.live.llm_validate import print_llm_validation, validate_llm_dirs
from schedsim.live.validation import (arrival_hash, band_cell, band_fields, compare_runs, err_pct, is_llm_dir,
                                      load_run_dir, pooled_metric, print_band_line, report_table, write_report)

METRICS = (  # (key in validation.json, key in summary.json, label)
    ("p50", "p50_ms", "latency p50 (ms)"),
    ("p90", "p90_ms", "latency p90 (ms)"),
    ("p99", "p99_ms", "latency p99 (ms)"),
    ("p999", "p999_ms", "latency p99.9 (ms)"),
    ("mean", "mean_ms", "latency mean (ms)"),
    ("throughput", "throughput_rps", "throughput (req/s)"),
    ("mean_batch_size", "mean_batch_size", "mean batch size"),
)


def compare(sim: dict, live: dict, sim_cols: dict, live_cols: dict) -> dict:
    """The comparison as a dict (validation.json without the provenance)."""
    from scipy.stats import ks_2samp  # lazy: scipy.stats costs about a second of start-up

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
        band_fields(row, sim, skey)
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
        from scipy.stats import ks_2samp  # lazy: scipy.stats costs about a second of start-up

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


def validate_dirs(sim_dir, live_dir, *, out=None, plot: bool = False) -> dict:
    """Compare a prediction with one live run (or several: ``live_dir`` a list, see the module
    docstring); write validation.json (and the plot) into ``out``, by default the (first)
    live directory; return the report."""
    live_dirs = [live_dir] if isinstance(live_dir, (str, Path)) else list(live_dir)
    if not live_dirs:
        raise InputError("--live: give at least one schedsim live output directory")
    if is_llm_dir(sim_dir) or any(is_llm_dir(d) for d in live_dirs):   # TTFT/TPOT/E2E instead of latency
        return validate_llm_dirs(sim_dir, live_dirs, out=out, plot=plot)
    sim, sim_cols, live, live_cols, report = compare_runs(sim_dir, live_dirs, load_run_dir, compare, pool_runs)
    live_dir = live_dirs[0]
    lat_sim, lat_live = report.pop("_latencies")
    report.update(sim_dir=str(sim_dir), live_dir=str(live_dir),
                  trace_requests=len(live_cols["arrival_s"]), arrivals_sha256=arrival_hash(live_cols["arrival_s"]),
                  policy=live.get("config", {}).get("policy"), params=live.get("config", {}).get("params"),
                  instances=live.get("config", {}).get("instances"),
                  warmup_s=live.get("config", {}).get("warmup_s"))
    draw = (lambda out_dir: _plot_cdfs(out_dir / "latency_cdf_validation.png", lat_sim, lat_live, report)) \
        if plot else None
    return write_report(report, out, live_dir, draw)


def _plot_cdfs(path: Path, lat_sim: np.ndarray, lat_live: np.ndarray, report: dict) -> Path:
    import matplotlib  # lazy: matplotlib costs about a second of start-up; only --plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib costs about a second of start-up; only plots need it

    fig, ax = plt.subplots(figsize=(6, 4))
    for lat, label in ((lat_sim, "predicted (schedsim run)"), (lat_live, "measured (schedsim live)")):
        if lat.size:
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=label)
    ax.set(xlabel="latency (ms)", ylabel="fraction of requests",
           title=f"Latency CDF: KS = {report['ks_stat']:.3f}, p99 error {report['p99_err_pct']:+.1f}%")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    write_atomically(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)
    return path


def print_validation(report: dict) -> None:
    if report.get("kind") == "llm":
        return print_llm_validation(report)
    console, table, runs = report_table(report, f"{report['instances']} instance(s)",
                                        ("metric", "predicted", "measured", "error"))

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
        if len(table.columns) > len(cells):
            cells += band_cell(row)
        table.add_row(*cells)
    console.print(table)
    print_band_line(console, report)
    console.print(f"KS statistic {report['ks_stat']:.4f} (p = {report['ks_pvalue']:.3g}); "
                  f"completed {report['completed']['predicted']:,} predicted, {report['completed']['measured']:,} measured")
    for path in report.get("written", []):
        console.print(f"wrote {path}")
