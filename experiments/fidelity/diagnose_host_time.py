"""How much of a cell's miss is the host's speed? Live host time per batch against the model's.

For every one-instance dynamic cell with Poisson arrivals at >= --min-load in the given
runs (run_h200.py outputs: RUN/cells/NAME/{batches.csv, result.npz, live.json}), over the
busy batches (launched at the previous one's completion):

- host time per batch, live: the serving loop's gap (completion to the next engine call)
  plus the engine call's launch-to-synchronize time beyond its CUDA-event time; model: the
  profile's dispatch overhead for that batch size plus the table's mean beyond its
  ``gpu_ms_mean``. Their ratio, and the share of --window-s windows where the live host
  time ran over 1.5x the model's (a slow spell);
- the SM clock during the cell (mean, min), when the run sampled nvidia-smi (RUN/smi.csv);
- p99 error of the default model (e) and of model h: e with the cell's own mean live host
  time per busy batch in place of the model's. Model h is a diagnostic, fitted to the live
  cell: it says how much of the miss the host's mean speed accounts for, nothing more.

    python experiments/fidelity/diagnose_host_time.py RUN [RUN ...] [--out host_time.csv]
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.raw_runs import require  # noqa: E402

from experiments.fidelity.analyze import live_result  # noqa: E402
from schedsim.cost.model import CostModel  # noqa: E402
from schedsim.core.metrics import summarize  # noqa: E402
from schedsim.registry import build_policy  # noqa: E402
from schedsim.core.policy import Requests  # noqa: E402
from schedsim.cost.profile import load_profile  # noqa: E402
from schedsim.core.simulate import simulate  # noqa: E402

PROFILE = ROOT / "profiles" / "bert-base-fp16-cg-h200.csv"
DUO = ROOT / "profiles" / "bert-base-fp16-cg-2inst-h200.csv"


def model_host_us(profile, samples: np.ndarray) -> np.ndarray:
    """The model's host part of a batch: dispatch overhead plus the table's time beyond the GPU's."""
    t = profile.columns
    beyond_gpu_us = np.interp(samples, profile.batches, (t["latency_ms_mean"] - t["gpu_ms_mean"]) * 1e3)
    meta = profile.meta
    return meta["dispatch_overhead_us"] + meta.get("dispatch_overhead_us_per_sample", 0.0) * (samples - 1) + beyond_gpu_us


def smi_clock(run: Path) -> pd.DataFrame | None:
    """RUN/smi.csv on the epoch clock (run_info.json's ``smi`` gives the device's UTC offset)."""
    path = run / "smi.csv"
    info = json.loads((run / "run_info.json").read_text()).get("smi") if (run / "run_info.json").exists() else None
    if not path.exists() or not info:
        return None
    smi = pd.read_csv(path, header=None, skipinitialspace=True,
                      names=["stamp", "sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle"])
    smi["epoch_s"] = [datetime.strptime(s + info["utc_offset"], "%Y/%m/%d %H:%M:%S.%f%z").timestamp()
                      for s in smi.stamp]
    return smi


def p99_err(trace, cfg, cost, live_p99: float, replications: int) -> float:
    p99 = [summarize(simulate(Requests.from_trace(trace), build_policy(cfg["policy"], dict(cfg["params"])),
                              cost, seed=1 + r), cfg["warmup_s"])["p99_ms"] for r in range(replications)]
    return (float(np.mean(p99)) / live_p99 - 1) * 100


def diagnose_cell(cell_dir: Path, profile, duo, smi, *, min_load: float, window_s: float,
                  replications: int) -> dict | None:
    live_info = json.loads((cell_dir / "live.json").read_text())
    cell = live_info["cell"]
    if cell["instances"] != 1 or cell["policy"] != "dynamic" or cell["cv"] != 1 or cell.get("spin_us") \
            or cell["load"] < min_load:
        return None
    cfg = json.loads((cell_dir / "summary.json").read_text())["config"]
    b = pd.read_csv(cell_dir / "batches.csv")
    busy = b[(b.status == "ok") & (b.trigger == "completion")]
    live_us = busy.gap_us.to_numpy() + (busy.host_ms - busy.gpu_ms).to_numpy() * 1e3
    model_us = model_host_us(profile, busy.samples.to_numpy())
    windows = pd.DataFrame({"w": (busy.issue_s / window_s).astype(int), "live": live_us, "model": model_us})
    by_window = windows.groupby("w")[["live", "model"]].sum()
    row = {"cell": cell_dir.name, "load": cell["load"], "busy_batches": len(busy),
           "host_live_us": float(live_us.mean()), "host_model_us": float(model_us.mean()),
           "host_ratio": float(live_us.mean() / model_us.mean()),
           "slow_window_share": float((by_window.live > 1.5 * by_window.model).mean())}
    if smi is not None and "wall_epoch_s" in live_info:
        start, end = live_info["wall_epoch_s"]
        during = smi[(smi.epoch_s > start + cfg["warmup_s"]) & (smi.epoch_s < end)]
        row.update(sm_mhz_mean=float(during.sm_mhz.mean()), sm_mhz_min=float(during.sm_mhz.min()))
    trace, live = live_result(cell_dir)
    live_p99 = summarize(live, cfg["warmup_s"])["p99_ms"]
    row["p99_live_ms"] = live_p99
    meta = profile.meta
    # h: every batch's host part moved by the cell's mean live-minus-model host time (the
    # dispatch overhead carries it; it cannot go below zero).
    shift_us = float(live_us.mean() - model_us.mean())
    for label, dispatch_us in (("e", meta["dispatch_overhead_us"]),
                               ("h", max(meta["dispatch_overhead_us"] + shift_us, 0.0))):
        cost = CostModel.from_profile(profile, dispatch_overhead_s=dispatch_us * 1e-6,
                                      dispatch_per_sample_s=meta.get("dispatch_overhead_us_per_sample", 0.0) * 1e-6)
        cost.with_contention({2: CostModel.from_profile(duo, wake_overhead_s=0.0)})
        row[f"p99_err_{label}_pct"] = p99_err(trace, cfg, cost, live_p99, replications)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--min-load", type=float, default=0.7)
    ap.add_argument("--window-s", type=float, default=0.25)
    ap.add_argument("--replications", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    require(*args.runs)
    profile, duo = load_profile(PROFILE), load_profile(DUO)
    rows = []
    for run in args.runs:
        smi = smi_clock(run)
        for cell_dir in sorted((run / "cells").iterdir()):
            row = diagnose_cell(cell_dir, profile, duo, smi, min_load=args.min_load, window_s=args.window_s,
                                replications=args.replications)
            if row:
                rows.append({"run": run.name, **row})
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table.round(3).to_string(index=False))
    for label in ("e", "h"):
        e = table[f"p99_err_{label}_pct"].abs()
        print(f"model {label}: p99 error median {e.median():.1f}%, worst {e.max():.1f}% over {len(e)} cells")
    if args.out:
        table.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
