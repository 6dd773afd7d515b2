"""How fast the host served each live run of ``bands_cpu.py``, against the profile.

For every live batch, the engine call's wall time (``host_ms`` in batches.csv) over the
profile's mean for its batch size is the host's slowdown at that moment. Per live run this
gives the run's factor (the mean over its batches: a stall counts with its full length,
as it does in the queue) and, over windows of ``--window-s`` by issue time, how far the
factor moves within the run. The same figures are what a host-variation record claims
(:mod:`schedsim.profiling.host_variation`); ``--out`` writes one row per live run.

    python experiments/fidelity-cpu/host_factors.py /tmp/bands-cpu/a --out factors.csv
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from schedsim.cost.profile import load_profile


def batches(live_dir: Path, mean_ms: dict, warmup_s: float) -> tuple[pd.DataFrame, np.ndarray]:
    """A live run's measured batches and each one's engine time over the table's mean for its size."""
    b = pd.read_csv(live_dir / "batches.csv")
    b = b[(b.status == "ok") & (b.issue_s >= warmup_s)]
    return b, b.host_ms.to_numpy() / b.samples.map(mean_ms).to_numpy()


def run_factors(live_dir: Path, mean_ms: dict, window_s: float, warmup_s: float) -> dict:
    b, ratio = batches(live_dir, mean_ms, warmup_s)
    w = np.floor(b.issue_s.to_numpy() / window_s).astype(int)
    windows = pd.Series(ratio).groupby(w).mean()
    factor = float(ratio.mean())
    return {"factor_mean": factor, "factor_median": float(np.median(ratio)),
            "window_cv": float((windows / factor).std(ddof=1)) if len(windows) > 1 else 0.0,
            "window_max": float(windows.max() / factor), "batches": int(ratio.size),
            "stall_share": float(np.mean(ratio > 3.0)),
            "dispatch_us_mean": float(b.dispatch_us.mean()), "gap_us_mean": float(b.gap_us.mean())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="bands_cpu.py's --out directory")
    ap.add_argument("--window-s", type=float, default=0.25)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    prof = load_profile(args.run / "profile" / "bert-tiny-ort-cpu.csv")
    mean_ms = dict(zip(prof.table.batch.astype(int), prof.table.latency_ms_mean))
    rows = []
    for cell in sorted(p for p in args.run.iterdir() if (p / "sim").is_dir()):
        warmup = json.loads((cell / "sim" / "summary.json").read_text())["config"]["warmup_s"]
        for live in sorted(cell.glob("live-*")):
            rows.append({"cell": cell.name, "run": live.name, **run_factors(live, mean_ms, args.window_s, warmup)})
    table = pd.DataFrame(rows)
    if args.out:
        table.to_csv(args.out, index=False, float_format="%.4g")
    with pd.option_context("display.width", 200):
        print(table.to_string(index=False))
        by_run = table.groupby("run").factor_mean.median()
        print("median factor per round:", by_run.round(3).to_dict())
        print(f"log-sd of run factors {np.log(table.factor_mean).std(ddof=1):.4f}; "
              f"median window cv {table.window_cv.median():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
