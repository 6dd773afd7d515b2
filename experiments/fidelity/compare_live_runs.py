"""How well does the live system repeat itself? Measured p99 of the same cells across runs.

The fidelity targets (p99 within 3% median, 8% worst) only mean something if a live cell,
run again, lands within them. Each input is either an analysis table
(``results*/fidelity.csv``: its measured columns) or a device run directory (``cells/``,
with repeats named ``NAME~rK``); cells are matched by name (the repeat suffix dropped).
For each cell seen more than once: every measured p99, and the spread as the largest
relative difference from the first run. Prints the table and the medians, and writes it
with --out.

    python experiments/fidelity/compare_live_runs.py experiments/fidelity/results-run4/fidelity.csv \\
        experiments/fidelity/results/fidelity.csv --out experiments/fidelity/repeatability/across_runs.csv
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.raw_runs import require  # noqa: E402


def measured_p99(source: Path) -> pd.DataFrame:
    """cell, instances, p99_ms: one row per live run in ``source``."""
    if source.is_dir():
        rows = []
        for summary in sorted((source / "cells").glob("*/summary.json")):
            s = json.loads(summary.read_text())
            rows.append({"cell": summary.parent.name.split("~")[0], "instances": s["config"]["instances"],
                         "p99_ms": s["p99_ms"]})
        return pd.DataFrame(rows)
    t = pd.read_csv(source).drop_duplicates("cell")  # one row per cell (several models share the measurement)
    return pd.DataFrame({"cell": t.cell, "instances": t.instances, "p99_ms": t.p99_measured})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", type=Path, help="fidelity.csv tables or device run directories")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    require(*args.sources)
    runs = pd.concat([measured_p99(s).assign(run=k) for k, s in enumerate(args.sources)], ignore_index=True)
    rows = []
    for (cell, instances), g in runs.groupby(["cell", "instances"], sort=True):
        if len(g) < 2:
            continue
        p99 = g.p99_ms.to_numpy()
        rows.append({"cell": cell, "instances": int(instances), "runs": len(p99),
                     "p99_ms": " ".join(f"{v:.3f}" for v in p99),
                     "max_diff_pct": float(abs(p99[1:] / p99[0] - 1).max() * 100)})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    for label, t in (("one instance", table[table.instances == 1]),
                     ("one instance, below 90% load", table[(table.instances == 1) & ~table.cell.str.contains("90%")])):
        if len(t):
            print(f"{label}: {len(t)} cells, p99 spread median {t.max_diff_pct.median():.1f}%, "
                  f"worst {t.max_diff_pct.max():.1f}%")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False, float_format="%.4g")
    return 0


if __name__ == "__main__":
    sys.exit(main())
