"""How fast each fresh Triton server ran against the cost table: per grid run, each batch
size's cost in Triton's own statistics over the table's mean for that size.

``run_h200.py`` starts a fresh server for every replication of a configuration, and that
server serves all its cells (loads). So the runs of one replication share a server, and a
server's speed shows in every cell it served. Per run, the ratio of each size Triton
formed at least ``--min-executions`` times (compute_input + compute_infer + compute_output
per execution, as the table's ``latency_ms_mean``), and the run's factor: the geometric
mean of its sizes' ratios weighted by executions. Per server (configuration and
replication), the factor over all its cells.

Nothing here feeds a prediction: the figures say how much a table measured on one server
can be off for another, which is what the profile's host-variation record over fresh
servers (``schedsim profile --backend triton --host-variation-s S --triton-host-servers N``)
measures before any live run.

    python experiments/triton/server_speed.py --profile P.csv --grid G.jsonl [--out speeds.csv]
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

from schedsim.cost.profile import load_profile  # noqa: E402

PHASES = ("compute_input", "compute_infer", "compute_output")


def size_costs(delta: dict, min_executions: int) -> dict:
    """batch size -> (executions, mean ms per execution) from a statistics difference."""
    out = {}
    for b, phases in delta.get("batch_stats", {}).items():
        n = phases.get("compute_infer", {}).get("count", 0)
        if n >= min_executions:
            out[int(b)] = (n, sum(phases[p]["ns"] for p in PHASES if p in phases) / n / 1e6)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, required=True, help="the table (schedsim profile --backend triton)")
    ap.add_argument("--grid", type=Path, nargs="+", required=True)
    ap.add_argument("--min-executions", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    table = load_profile(args.profile).table
    mean = dict(zip(table["batch"].astype(int), table["latency_ms_mean"].astype(float)))
    rows = []
    for g in args.grid:
        for line in g.read_text().splitlines():
            run = json.loads(line)
            for b, (n, ms) in size_costs(run["triton_delta"], args.min_executions).items():
                if b in mean:
                    rows.append({"grid": g.parent.name, "config": run["config"], "rep": run["rep"],
                                 "load": run["load"], "batch": b, "executions": n, "ms": round(ms, 4),
                                 "table_ms": round(mean[b], 4), "ratio": round(ms / mean[b], 4)})
    if not rows:
        raise SystemExit(f"no batch size with {args.min_executions}+ executions that the table covers")
    df = pd.DataFrame(rows)

    def factor(g: pd.DataFrame) -> float:
        return float(np.exp(np.average(np.log(g["ratio"]), weights=g["executions"])))

    runs = df.groupby(["grid", "config", "rep", "load"]).apply(factor, include_groups=False).rename("factor")
    servers = df.groupby(["grid", "config", "rep"]).apply(factor, include_groups=False).rename("server_factor")
    print(df.to_string(index=False))
    print()
    print(runs.round(3).to_string())
    print()
    print(servers.round(3).to_string())
    spread = servers.groupby(level=[0, 1]).agg(lambda f: f.max() / f.min())
    print("\nfastest to slowest server, per machine and configuration:")
    print(spread.round(3).to_string())
    if args.out:
        df.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
