"""How much of the Triton error is the server's speed: each live run predicted again with its
own server's batch costs (a diagnostic: it reads the run's own statistics, so it is no
prediction).

For each run of a grid, the table is corrected by that server's measured batch costs
(``server_speed.py``'s rows for its configuration and replication, all its cells) in two
forms, and the cell simulated without a host record:

- ``scaled``: every batch's time times the server's factor (the geometric mean of its sizes'
  ratios, weighted by executions);
- ``shifted``: every batch's time plus the server's mean extra per execution (ms).

The server-side mean and p99 (execution log plus the batch's response phase, as
``analyze.py --requests``) of each run against the table as measured and the two corrected
forms; medians of the absolute errors below and near capacity.

    python experiments/triton/own_speed.py --profile P.csv --grid G.jsonl --requests R \
        --speeds results/server_speed_h200_m5.csv [--extrapolate] --out own_speed_m5.csv
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import analyze  # noqa: E402
from schedsim.cost.profile import load_profile, save_profile  # noqa: E402

NEAR_CAPACITY = 0.85
"""Loads at or above this share of capacity are summarised apart."""


def corrected_profile(profile: Path, out: Path, factor: float = 1.0, extra_ms: float = 0.0) -> Path:
    """``profile`` with every batch's time (means, percentiles, raw samples) times ``factor``
    plus ``extra_ms``, without its host record."""
    prof = load_profile(profile)
    table = prof.table.copy()
    for col in [c for c in table.columns if c.startswith("latency_ms_") and "std" not in c]:
        table[col] = table[col] * factor + extra_ms
    if "latency_ms_std" in table:
        table["latency_ms_std"] = table["latency_ms_std"] * factor
    samples = {k: v * factor + extra_ms for k, v in prof.samples.items()} if prof.samples else None
    out.mkdir(parents=True, exist_ok=True)
    path = out / profile.name
    save_profile(table, {k: v for k, v in prof.meta.items() if k != "host_variation"}, path, samples)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--grid", type=Path, required=True)
    ap.add_argument("--requests", type=Path, required=True, help="the grid's per-request npz files")
    ap.add_argument("--speeds", type=Path, required=True, help="server_speed.py --out of the same grid and table")
    ap.add_argument("--replications", type=int, default=5)
    ap.add_argument("--extrapolate", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    speeds = pd.read_csv(args.speeds)
    speeds["extra_ms"] = speeds["ms"] - speeds["table_ms"]
    per_server = speeds.groupby(["config", "rep"]).apply(lambda g: pd.Series({
        "factor": float(np.exp(np.average(np.log(g["ratio"]), weights=g["executions"]))),
        "extra_ms": float(np.average(g["extra_ms"], weights=g["executions"]))}), include_groups=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        table = corrected_profile(args.profile, work / "table")
        for line in args.grid.read_text().splitlines():
            run = json.loads(line)
            server = per_server.loc[(run["config"], run["rep"])]
            where = work / f"{run['config']}-rep{run['rep']}"
            forms = {"table": table,
                     "scaled": corrected_profile(args.profile, where / "scaled", factor=server["factor"]),
                     "shifted": corrected_profile(args.profile, where / "shifted", extra_ms=server["extra_ms"])}
            side = analyze.response_ready(args.requests / f"{run['config']}-{run['arrival']}-{run['load']:g}"
                                                          f"-rep{run['rep']}.npz", run["triton_delta"], analyze.WARMUP_S)
            live = {"mean": analyze.server_mean_ms(run["triton_delta"]), "p99": side["p99_ms"]}
            row = {"config": run["config"], "load": run["load"], "rep": run["rep"],
                   "server_factor": round(server["factor"], 4), "server_extra_ms": round(server["extra_ms"], 4),
                   "live_mean_ms": round(live["mean"], 4), "live_p99_ms": round(live["p99"], 4)}
            for name, prof in forms.items():
                sim = analyze.simulate_cell(run, prof, args.replications, work, extrapolate=args.extrapolate)
                for q in ("mean", "p99"):
                    row[f"{name}_{q}_err_pct"] = round(100 * (sim[f"{q}_ms"] - live[q]) / live[q], 2)
            rows.append(row)
    df = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    for label, part in (("below", df[df.load < NEAR_CAPACITY]), ("near capacity", df[df.load >= NEAR_CAPACITY])):
        if len(part):
            print(f"{label} ({len(part)} runs): median |error| mean / p99: " + "; ".join(
                f"{name} {part[f'{name}_mean_err_pct'].abs().median():.1f}% / {part[f'{name}_p99_err_pct'].abs().median():.1f}%"
                for name in ("table", "scaled", "shifted")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
