"""A between-server host-variation record from servers' measured speeds, for a band held out
from the machine it predicts.

``server_speed.py`` gives, per grid run, how fast each fresh Triton server ran its batches
against the table measured on its machine just before. Here each server's factor (the
geometric mean of its batch sizes' ratios over all its cells, weighted by executions)
becomes one round of a ``host_variation`` record with ``rounds_are: servers``: a band built
on it draws one server per replication and runs the whole trace at that server's speed, as
``schedsim profile --backend triton --triton-host-servers N`` records it on the machine
itself. Given the speeds of *other* machines, the record is measured apart from the cells it
is checked on (leave one machine out).

With ``--within SIDECAR`` (a profile's own record), each server's round also moves within
the run as that record's rounds did (their windows over their own mean, cycled over the
servers), so a replication has both a server's level and the host's movement within a run.

    python experiments/triton/server_record.py --speeds results/server_speed_h200_m3.csv \
        results/server_speed_h200_m4.csv [--within PROFILE.json] --out record.json

``analyze.py --host-record record.json`` predicts with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

LEVEL_WINDOW_S = 1.0
"""Window length of a level-only record: one window per server, held through the run."""


def server_factors(paths: list[Path]) -> pd.Series:
    """(grid, config, rep) -> the server's speed over its table, from server_speed.py's rows."""
    df = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    return df.groupby(["grid", "config", "rep"]).apply(
        lambda g: float(np.exp(np.average(np.log(g["ratio"]), weights=g["executions"]))), include_groups=False)


def server_record(factors: pd.Series, within: dict | None = None) -> dict:
    levels = factors.to_numpy(dtype=np.float64)
    cv = float(levels.std(ddof=1) / levels.mean()) if levels.size > 1 else 0.0
    rec = {"between_runs_cv": cv, "rounds": int(levels.size), "rounds_are": "servers",
           "round_factors": [round(float(v), 5) for v in levels],
           "servers": [f"{g}/{c}/rep{r}" for g, c, r in factors.index],
           "scope": f"{levels.size} fresh Triton servers on {factors.index.get_level_values(0).nunique()} machines, "
                    "each against its own machine's table",
           "method": "server_speed.py per batch size (compute_input + compute_infer + compute_output per execution "
                     "over the table's latency_ms_mean), one geometric mean per server weighted by executions"}
    if within is None:
        return rec | {"within_run_cv": 0.0, "window_s": LEVEL_WINDOW_S, "windows": int(levels.size),
                      "window_factors": [[1.0] for _ in levels]}
    own = [np.asarray(r, dtype=np.float64) for r in within["window_factors"]]
    own = [r / r.mean() for r in own if r.size]
    windows = [own[k % len(own)] for k in range(levels.size)]
    return rec | {"within_run_cv": float(within.get("within_run_cv", 0.0)), "window_s": float(within["window_s"]),
                  "windows": int(sum(w.size for w in windows)),
                  "window_factors": [[round(float(v), 5) for v in w] for w in windows],
                  "within_from": within.get("scope", "a profile's host_variation record")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speeds", type=Path, nargs="+", required=True, help="server_speed.py --out files")
    ap.add_argument("--within", type=Path, help="a profile sidecar whose host_variation windows give the "
                                                "movement within a run")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    within = None
    if args.within is not None:
        within = json.loads(args.within.read_text()).get("host_variation")
        if not isinstance(within, dict) or not within.get("window_factors"):
            raise SystemExit(f"{args.within}: no host_variation record with window_factors")
    factors = server_factors(args.speeds)
    rec = server_record(factors, within)
    args.out.write_text(json.dumps({"host_variation": rec}, indent=1) + "\n")
    print(f"{rec['rounds']} servers, levels {min(rec['round_factors']):.3f}-{max(rec['round_factors']):.3f}, "
          f"between-servers CV {rec['between_runs_cv']:.1%}"
          + (f", within-run CV {rec['within_run_cv']:.1%}" if within else "") + f": {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
