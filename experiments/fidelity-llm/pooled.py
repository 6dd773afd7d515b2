"""Predicted LLM metrics against the median of several live runs of the same cells.

One live run of a cell moves from the next by several percent (the host's speed, the
small eager steps' spread: diagnose_isolated_eager.py), and the p99 of 50-450 requests
by more. Every run replays the same cell traces, and the simulator's prediction is the
same each time, so the median over runs is a steadier measurement. This is what
``schedsim validate --sim SIM --live A --live B --live C`` reports for one cell; here for
every cell of the given analyses (``analyze.py --results DIR``; the first one's ``sim/``
is the prediction). Writes one row per cell and metric: predicted, the runs' values,
their median, the error against it, whether the prediction lies in the runs' range, and
how well one run predicts the others (leave one out: the live system as its own predictor).

    python experiments/fidelity-llm/pooled.py experiments/fidelity-llm/results \\
        experiments/fidelity-llm/results-run9 experiments/fidelity-llm/results-run11 \\
        --out experiments/fidelity-llm/repeatability/pooled.csv
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.raw_runs import require  # noqa: E402

from experiments.fidelity.pooled import leave_one_out  # noqa: E402
from schedsim.live.llm_validate import TARGETS_PCT, validate_llm_dirs  # noqa: E402

METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99")


def pooled(results: list[Path]) -> pd.DataFrame:
    """One row per (cell, metric) of the first analysis's cells that at least two analyses have
    (a run cut short by its time budget lacks its last cells)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cell in sorted(p.name for p in (results[0] / "cells").iterdir() if p.is_dir()):
            runs = [r for r in results if (r / "cells" / cell / "live").is_dir()]
            if len(runs) < 2:
                continue
            report = validate_llm_dirs(results[0] / "cells" / cell / "sim",
                                       [r / "cells" / cell / "live" for r in runs], out=Path(tmp) / cell)
            for m in METRICS:
                row = report["metrics"][m]
                rows.append({"cell": cell, "metric": m, "runs": len(runs), "predicted": row["predicted"],
                             "live_median": row["measured"], "err_pct": row["err_pct"],
                             "live_min": row["measured_range"][0], "live_max": row["measured_range"][1],
                             "in_live_range": row["predicted_in_measured_range"],
                             **dict(zip(("live_loo_median_pct", "live_loo_worst_pct"),
                                        leave_one_out(np.asarray(row["measured_runs"], dtype=float)))),
                             **{f"live_{r.name}": v for r, v in zip(runs, row["measured_runs"])}})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="analyze.py --results folders, one per live run")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    require(*args.results)
    if len(args.results) < 2:
        ap.error("give at least two analyses")
    table = pooled(args.results)
    wide = table.pivot(index="cell", columns="metric", values="err_pct")[list(METRICS)]
    with pd.option_context("display.width", 200):
        print(wide.round(1).to_string())
    e = table.err_pct.abs()
    within = {m: (table[table.metric == m].err_pct.abs() <= TARGETS_PCT[m]).sum() for m in METRICS}
    print(f"{len(args.results)} runs, {len(wide)} cells: error against the live median: median {e.median():.1f}%, "
          f"worst {e.max():.0f}% ({table.loc[e.idxmax(), 'cell']} {table.loc[e.idxmax(), 'metric']}); "
          f"within target {sum(within.values())} of {len(table)}; prediction inside the runs' range "
          f"{int(table.in_live_range.sum())} of {len(table)}")
    for m in METRICS:
        t = table[table.metric == m].err_pct.abs()
        print(f"  {m}: median {t.median():.1f}%, within {TARGETS_PCT[m]:.0f}%: {within[m]} of {len(t)}")
    print(f"one live run against the median of the others: median {table.live_loo_median_pct.median():.1f}%, "
          f"worst {table.live_loo_worst_pct.max():.0f}%")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
