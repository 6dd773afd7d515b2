"""Fit the wake-up curve (extra time of a launch by how long its loop was idle) from
calibration loops, never from a validation cell, and write it into a profile's sidecar.

Input: batches.csv-style files of the live runner's light-load serving loops
(``calibrate_h200.py``'s ``loop_*_light.csv`` and ``calibrate_loops.py``'s
``loops/loop_*.csv``). For every launch triggered by an arrival on an idle instance:
idle = trigger time - the previous batch's completion, extra = (completion - trigger) -
the profile's mean latency for its batch size (times the sidecar's ``power_cap`` clock factor at
launch, as the simulator prices it, when there is one) - the dispatch overhead for its batch size. Launches
are binned by idle time (log-spaced edges); each bin with at least ``--min-n`` launches
gives a point: median idle, mean extra and the extra's quantiles (negatives clipped to 0).

With ``--dispatch-loops`` it first fits the dispatch overhead itself, as the live runner
pays it: over the busy launches of those loops (a completion-triggered launch that follows
another completion-triggered one, so nothing slept), the host gap from the previous batch's
completion to the engine call, least squares in the batch size: a + c x (samples - 1)
(``dispatch_overhead_us``, ``dispatch_overhead_us_per_sample``). The serving loop's
bookkeeping and input gathering grow with the batch; the profile's own bare loop
(``np.stack`` and launch, 44 µs on average over sizes 1-64) sees only part of it.

    python experiments/fidelity/fit_wake_curve.py experiments/fidelity/calibration/loop_*_light.csv \\
        experiments/fidelity/calibration/loops/loop_*.csv --profile profiles/bert-base-fp16-cg-h200.csv \\
        --dispatch-loops experiments/fidelity/calibration/loop_none.csv experiments/fidelity/calibration/loop_dynamic.csv \\
        experiments/fidelity/calibration/loops/loop_*.csv [--write]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.raw_runs import require  # noqa: E402

EDGES_MS = (0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, np.inf)


def busy_launches(paths, skip_s: float = 0.5) -> pd.DataFrame:
    """One row per launch made at a completion that itself followed a completion-triggered
    launch (the loop never slept between them): samples, gap_us, source."""
    out = []
    for path in paths:
        b = pd.read_csv(path)
        b = b[b.status == "ok"].sort_values("batch")
        busy = b.trigger.eq("completion") & b.trigger.shift(1).eq("completion") & (b.decide_s > skip_s)
        out.append(pd.DataFrame({"samples": b.samples[busy], "gap_us": b.gap_us[busy], "source": Path(path).name}))
    return pd.concat(out, ignore_index=True)


def fit_dispatch(launches: pd.DataFrame) -> dict:
    """Least squares gap_us = a + c x (samples - 1) over busy launches."""
    x = launches.samples.to_numpy(np.float64) - 1.0
    (a, c), *_ = np.linalg.lstsq(np.c_[np.ones_like(x), x], launches.gap_us.to_numpy(np.float64), rcond=None)
    by_size = launches.groupby("samples").gap_us.agg(["size", "mean"])
    return {"dispatch_overhead_us": round(float(a), 2), "dispatch_overhead_us_per_sample": round(float(c), 4),
            "n": len(launches), "sizes": {int(k): [int(r["size"]), round(float(r["mean"]), 1)]
                                           for k, r in by_size.iterrows() if r["size"] >= 20}}


def clock_factors(b: pd.DataFrame, power_cap) -> np.ndarray:
    """The power cap's factor at each batch's launch, the loop's batches replayed in order: the
    simulator prices a batch at the table's mean times it, so the extra is taken over that."""
    if power_cap is None:
        return np.ones(len(b))
    from schedsim.cost.power import replay

    return replay(power_cap, b.issue_s, b.done_s, b.samples)


def wake_launches(paths, mean_ms: pd.Series, dispatch_us: float, skip_s: float = 0.5,
                  per_sample_us: float = 0.0, power_cap=None) -> pd.DataFrame:
    """One row per arrival-triggered launch on an idle loop: idle_us, extra_us, source."""
    out = []
    for path in paths:
        b = pd.read_csv(path)
        b = b[b.status == "ok"].sort_values("batch")
        idle_us = (b.trigger_s - b.done_s.shift(1)) * 1e6
        dispatch = dispatch_us + per_sample_us * (b.samples.to_numpy() - 1)
        table_ms = mean_ms.loc[b.samples].to_numpy() * clock_factors(b, power_cap)
        extra_us = ((b.done_s - b.trigger_s) * 1e3 - table_ms) * 1e3 - dispatch
        keep = (b.trigger == "arrival") & (idle_us > 0) & (b.issue_s > skip_s)
        out.append(pd.DataFrame({"idle_us": idle_us[keep], "extra_us": extra_us[keep], "source": Path(path).name}))
    return pd.concat(out, ignore_index=True)


PROBS = tuple(round(p, 2) for p in np.arange(0.0, 1.0, 0.05)) + (0.99, 1.0)


def fit_curve(launches: pd.DataFrame, min_n: int = 20) -> dict:
    """Per bin: median idle, mean extra and the extra's quantiles at PROBS (negatives clipped to 0)."""
    bins = pd.cut(launches.idle_us / 1e3, EDGES_MS)
    points = {"idle_us": [], "extra_us": [], "n": [], "probs": list(PROBS), "extra_q_us": []}
    for _, g in launches.groupby(bins, observed=True):
        if len(g) < min_n:
            continue
        extra = np.maximum(g.extra_us.to_numpy(), 0.0)
        points["idle_us"].append(round(float(g.idle_us.median()), 1))
        points["extra_us"].append(round(float(extra.mean()), 1))
        points["n"].append(len(g))
        points["extra_q_us"].append([round(float(v), 1) for v in np.quantile(extra, PROBS)])
    return points


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("loops", nargs="+", type=Path)
    ap.add_argument("--profile", type=Path, default=ROOT / "profiles" / "bert-base-fp16-cg-h200.csv")
    ap.add_argument("--min-n", type=int, default=20)
    ap.add_argument("--dispatch-loops", nargs="*", type=Path, default=[],
                    help="loops whose busy launches fit the dispatch overhead by batch size first")
    ap.add_argument("--write", action="store_true", help="store the curve in the profile's sidecar")
    args = ap.parse_args(argv)
    require(*args.loops, *args.dispatch_loops)
    side = args.profile.with_suffix(".json")
    meta = json.loads(side.read_text())
    mean_ms = pd.read_csv(args.profile).set_index("batch").latency_ms_mean
    if args.dispatch_loops:
        fit = fit_dispatch(busy_launches(args.dispatch_loops))
        fit["source"] = "experiments/fidelity/fit_wake_curve.py --dispatch-loops " + " ".join(
            str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p) for p in args.dispatch_loops)
        fit["what"] = ("host gap from a batch's completion to the next engine call in the live runner's busy "
                       "launches, least squares a + c x (samples - 1)")
        print(json.dumps(fit, indent=1))
        meta.setdefault("dispatch_overhead_bare_loop_us", meta.get("dispatch_overhead_us"))
        meta["dispatch_overhead_us"] = fit["dispatch_overhead_us"]
        meta["dispatch_overhead_us_per_sample"] = fit["dispatch_overhead_us_per_sample"]
        meta["dispatch_fit"] = fit
    from schedsim.cost.power import PowerCap

    power_cap = PowerCap.from_meta(meta, str(side))
    launches = wake_launches(args.loops, mean_ms, float(meta.get("dispatch_overhead_us", 0.0)),
                             per_sample_us=float(meta.get("dispatch_overhead_us_per_sample", 0.0)),
                             power_cap=power_cap)
    curve = fit_curve(launches, args.min_n)
    curve["source"] = ("experiments/fidelity/fit_wake_curve.py over " + ", ".join(
        str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p) for p in args.loops))
    curve["power_cap"] = power_cap is not None
    curve["what"] = ("extra time of a launch on an idle serving loop over the table's mean (times the power "
                     "cap's clock factor at launch, when the sidecar has one) and the dispatch "
                     "overhead, by idle time: per log-spaced bin the median idle, the mean extra and its "
                     "quantiles at probs (negatives clipped to 0); linear in log idle between points")
    print(json.dumps(curve, indent=1))
    if args.write:
        meta["wake_curve"] = curve
        side.write_text(json.dumps(meta, indent=2) + "\n")
        print(f"wrote wake_curve{' and the dispatch fit' if args.dispatch_loops else ''} into {side}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
