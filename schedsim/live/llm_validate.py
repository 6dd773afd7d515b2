"""``schedsim validate`` for LLM runs: a ``schedsim run`` directory against a ``schedsim live
--backend torch-llm`` one, same trace, policy and flags.

As the request-level comparison (:mod:`schedsim.live.validate`): errors are signed percent of
the measured value, ``(predicted - measured) / measured * 100``; distributions are
compared with the two-sample Kolmogorov-Smirnov statistic. Metrics: TTFT, TPOT and E2E
p50/p90/p99 and mean, ITL p50/p99, request and output-token throughput, preemptions
(the targets: latencies within 5%, preemptions within 10%), KS on TTFT, TPOT and
E2E over completed requests past the warm-up, and the CDFs overlaid in one figure.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from schedsim.errors import InputError
from schedsim.files import write_atomically
from schedsim.live.validation import (arrival_hash, band_cell, band_fields, compare_runs, err_pct, load_run_dir,
                                      pooled_metric, print_band_line, report_table,
                                      write_report)

LLM_METRICS = (  # (key in validation.json, key in summary.json, label)
    ("ttft_p50", "ttft_p50_ms", "TTFT p50 (ms)"),
    ("ttft_p90", "ttft_p90_ms", "TTFT p90 (ms)"),
    ("ttft_p99", "ttft_p99_ms", "TTFT p99 (ms)"),
    ("ttft_mean", "ttft_mean_ms", "TTFT mean (ms)"),
    ("tpot_p50", "tpot_p50_ms", "TPOT p50 (ms)"),
    ("tpot_p90", "tpot_p90_ms", "TPOT p90 (ms)"),
    ("tpot_p99", "tpot_p99_ms", "TPOT p99 (ms)"),
    ("tpot_mean", "tpot_mean_ms", "TPOT mean (ms)"),
    ("itl_p50", "itl_p50_ms", "ITL p50 (ms)"),
    ("itl_p99", "itl_p99_ms", "ITL p99 (ms)"),
    ("e2e_p50", "e2e_p50_ms", "E2E p50 (ms)"),
    ("e2e_p90", "e2e_p90_ms", "E2E p90 (ms)"),
    ("e2e_p99", "e2e_p99_ms", "E2E p99 (ms)"),
    ("e2e_mean", "e2e_mean_ms", "E2E mean (ms)"),
    ("throughput", "throughput_rps", "throughput (req/s)"),
    ("output_tokens_per_s", "output_tokens_per_s", "output tokens/s"),
    ("preemptions", "preemptions", "preemptions"),
    ("steps", "steps", "engine steps"),
    ("mean_step_ms", "mean_step_ms", "mean step (ms)"),
    ("mean_running", "mean_running", "mean running requests"),
    ("max_kv_blocks", "max_kv_blocks", "KV blocks peak"),
)
TARGETS_PCT = {"ttft_p50": 5.0, "ttft_p99": 5.0, "tpot_p50": 5.0, "tpot_p99": 5.0, "e2e_p50": 5.0,
               "e2e_p99": 5.0, "preemptions": 10.0}
"""Fidelity targets: absolute error in percent of the measured value."""
DISTRIBUTIONS = ("ttft", "tpot", "e2e")


def is_llm_summary(summary: dict) -> bool:
    return "ttft_p50_ms" in summary


def _err(p, m) -> float:
    if p is None or m is None:
        return math.nan
    if m == 0 and p == 0:
        return 0.0   # e.g. no preemption predicted and none measured
    return err_pct(float(p), float(m))


def _load(path: Path, what: str) -> tuple[dict, dict]:
    summary, cols = load_run_dir(path, what, numbers=("arrival_s", "ttft_ms", "tpot_ms", "e2e_ms"))
    if not is_llm_summary(summary):
        raise InputError(f"{what} {path}: not an LLM run (its summary has no ttft_p50_ms); compare an LLM "
                         "schedsim run with an LLM schedsim live")
    return summary, cols


def compare_llm(sim: dict, live: dict, sim_cols: dict, live_cols: dict) -> dict:
    """The LLM comparison as a dict (validation.json without the provenance)."""
    from scipy.stats import ks_2samp  # lazy: scipy.stats costs about a second of start-up

    warmup = float(live.get("config", {}).get("warmup_s", 0.0) or 0.0)

    def values(cols, key):
        keep = (cols["arrival_s"] >= warmup - 1e-12) & (cols["status"] == "completed")
        v = cols[key][keep]
        return np.sort(v[np.isfinite(v)])

    out: dict = {"kind": "llm", "metrics": {}}
    for key, skey, label in LLM_METRICS:
        p, m = sim.get(skey), live.get(skey)
        row = {"label": label, "predicted": p, "measured": m, "err_pct": _err(p, m)}
        if key in TARGETS_PCT:
            row["target_pct"] = TARGETS_PCT[key]
            row["within_target"] = bool(math.isfinite(row["err_pct"]) and abs(row["err_pct"]) <= TARGETS_PCT[key])
        ci = sim.get(f"{skey}_ci")
        if ci:
            row["predicted_ci"] = ci
            row["measured_in_ci"] = bool(m is not None and ci[0] <= m <= ci[1])
        band_fields(row, sim, skey)
        out["metrics"][key] = row
        out[f"{key}_err_pct"] = row["err_pct"]
    out["ks"] = {}
    dists = {}
    for name in DISTRIBUTIONS:
        a, b = values(sim_cols, f"{name}_ms"), values(live_cols, f"{name}_ms")
        dists[name] = (a, b)
        if a.size and b.size:
            ks = ks_2samp(a, b)
            out["ks"][name] = {"stat": float(ks.statistic), "pvalue": float(ks.pvalue)}
        else:
            out["ks"][name] = {"stat": math.nan, "pvalue": math.nan}
        out[f"ks_stat_{name}"] = out["ks"][name]["stat"]
    out["targets_met"] = all(out["metrics"][k].get("within_target", False) for k in TARGETS_PCT)
    for key in ("completed", "rejected", "failed", "unfinished"):
        out[key] = {"predicted": sim.get(key), "measured": live.get(key)}
    out["replications"] = int(sim.get("config", {}).get("replications", 1) or 1)
    out["live_timing"] = {k: live.get("live", {}).get(k) for k in ("engine_gpu_ms", "engine_ms", "step_host_ms")}
    out["_dists"] = dists
    return out


def pool_llm_runs(reports: list[dict]) -> dict:
    """One LLM comparison from several (:func:`compare_llm` against each live run): each
    metric's measurement the median over the runs (:func:`schedsim.live.validation.pooled_metric`),
    targets judged on it, KS against each distribution pooled over the runs."""
    from scipy.stats import ks_2samp  # lazy: scipy.stats costs about a second of start-up

    first = reports[0]
    out = {k: v for k, v in first.items() if k not in ("metrics", "ks", "_dists")}
    out.update(metrics={}, ks={}, live_runs=len(reports))
    for key, _, _ in LLM_METRICS:
        row = out["metrics"][key] = pooled_metric([r["metrics"][key] for r in reports], err=_err)
        if key in TARGETS_PCT:
            row["within_target"] = bool(math.isfinite(row["err_pct"]) and abs(row["err_pct"]) <= TARGETS_PCT[key])
        out[f"{key}_err_pct"] = row["err_pct"]
    dists = {}
    for name in DISTRIBUTIONS:
        a = first["_dists"][name][0]
        b = np.sort(np.concatenate([r["_dists"][name][1] for r in reports]))
        dists[name] = (a, b)
        stat = ks_2samp(a, b) if a.size and b.size else None
        out["ks"][name] = {"stat": float(stat.statistic) if stat else math.nan,
                           "pvalue": float(stat.pvalue) if stat else math.nan}
        out[f"ks_stat_{name}"] = out["ks"][name]["stat"]
    out["targets_met"] = all(out["metrics"][k].get("within_target", False) for k in TARGETS_PCT)
    for key in ("completed", "rejected", "failed", "unfinished"):
        out[key] = {"predicted": first[key]["predicted"], "measured_runs": [r[key]["measured"] for r in reports]}
    out["live_timing"] = [r["live_timing"] for r in reports]
    out["_dists"] = dists
    return out


SETTING_KEYS_IGNORED = ("profile", "device", "model", "overlap")
"""Effective settings that differ between a prediction and a live run by their nature."""


def setting_notes(sim_config: dict, live_config: dict) -> list[str]:
    """What makes the prediction describe another run than the live one: policy settings
    that differ (``config.effective`` of both summaries; a live run recorded before live
    summaries kept it has none, and gets no note) and async scheduling predicted for an
    engine that ran its steps in series."""
    sim_eff, live_eff = sim_config.get("effective"), live_config.get("effective")
    if not isinstance(sim_eff, dict) or not isinstance(live_eff, dict):
        return []
    notes = [f"{k}: {sim_eff[k]!r} in the prediction, {live_eff[k]!r} in the live run"
             for k in sim_eff if k in live_eff and k not in SETTING_KEYS_IGNORED and sim_eff[k] != live_eff[k]]
    if sim_eff.get("async_scheduling") and live_eff.get("async_scheduling") and not live_eff.get("overlap"):
        notes.append("the prediction hides each step's host time behind its GPU time (async scheduling), "
                     "the live engine ran its steps in series: compare runs made with --no-async-scheduling")
    return notes


def validate_llm_dirs(sim_dir, live_dir, *, out=None, plot: bool = False) -> dict:
    """Compare an LLM prediction with one live run (or several: ``live_dir`` a list, their
    median the measurement); write validation.json (and the plot); return the report."""
    live_dirs = [live_dir] if isinstance(live_dir, (str, Path)) else list(live_dir)
    sim, sim_cols, live, live_cols, report = compare_runs(sim_dir, live_dirs, _load, compare_llm, pool_llm_runs)
    live_dir = live_dirs[0]
    dists = report.pop("_dists")
    cfg = live.get("config", {})
    report.update(sim_dir=str(sim_dir), live_dir=str(live_dir), trace_requests=len(live_cols["arrival_s"]),
                  arrivals_sha256=arrival_hash(live_cols["arrival_s"]), policy=cfg.get("policy"),
                  params=cfg.get("params"), instances=cfg.get("instances"), warmup_s=cfg.get("warmup_s"),
                  model=cfg.get("model"), device=cfg.get("device"),
                  profile=sim.get("config", {}).get("profile"))
    notes = setting_notes(sim.get("config", {}), cfg)
    if notes:
        report["notes"] = notes
    draw = (lambda out_dir: plot_llm_cdfs(out_dir / "llm_cdf_validation.png", dists, report)) if plot else None
    return write_report(report, out, live_dir, draw)


def plot_llm_cdfs(path: Path, dists: dict, report: dict) -> Path:
    """TTFT, TPOT and E2E CDFs, predicted and measured, side by side."""
    import matplotlib  # lazy: matplotlib costs about a second of start-up; only --plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib costs about a second of start-up; only plots need it

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, name in zip(axes, DISTRIBUTIONS):
        for v, label in zip(dists[name], ("predicted (schedsim run)", "measured (schedsim live)")):
            if v.size:
                ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)
        p99 = report.get(f"{name}_p99_err_pct", math.nan)
        ax.set(xlabel=f"{name.upper()} (ms)", ylabel="fraction of requests",
               title=f"{name.upper()}: KS {report['ks'][name]['stat']:.3f}, p99 err {p99:+.1f}%")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    write_atomically(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path


def print_llm_validation(report: dict) -> None:
    console, table, runs = report_table(report, f"{report.get('model')} on {report.get('device')}",
                                        ("metric", "predicted", "measured", "error", "target"))

    def num(v):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        return f"{v:,.3f}" if isinstance(v, float) else f"{v:,}"

    for row in report["metrics"].values():
        e = row["err_pct"]
        target = ""
        if "target_pct" in row:
            target = f"{'ok' if row['within_target'] else 'MISS'} (±{row['target_pct']:g}%)"
        cells = [row["label"], num(row["predicted"]), num(row["measured"]),
                 "-" if not math.isfinite(e) else f"{e:+.1f}%", target]
        if runs > 1:
            r = row.get("measured_range")
            cells.append("-" if not r else f"{num(r[0])} - {num(r[1])}"
                         + (" (prediction inside)" if row.get("predicted_in_measured_range") else ""))
        if len(table.columns) > len(cells):
            cells += band_cell(row, num)
        table.add_row(*cells)
    console.print(table)
    print_band_line(console, report)
    ks = ", ".join(f"{k.upper()} {v['stat']:.3f}" for k, v in report["ks"].items())
    measured = report["completed"].get("measured", report["completed"].get("measured_runs"))
    console.print(f"KS statistics: {ks}; completed {report['completed']['predicted']} predicted, "
                  f"{measured} measured; targets met: {report['targets_met']}")
    for note in report.get("notes", []):
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    for path in report.get("written", []):
        console.print(f"wrote {path}")
