"""Predicted p99 against the median of several live runs of the same cells.

One live run of a cell moves by a median 6% from the next (compare_live_runs.py), more at
75-90% load, so the error against one run mixes the model's error with the run's luck.
Every run replays the same seeded trace per cell, so the median over runs is a steadier
measurement. Each input is an analysis table (``results*/fidelity.csv``) of one live run;
``--model`` picks its prediction rows. ``--exclude-two-instance`` drops the two-instance
cells of tables whose two-instance runs were not a measurement (their threads shared too
few CPUs). Prints, per cell: the prediction (median over tables: the same trace and seeds
give nearly the same figure), the live p99s, their median, range and the error against the
median, and how well one live run predicts the others (leave one out); then the medians
and worst cases by instances; writes the table with --out.

    python experiments/fidelity/pooled.py experiments/fidelity/results-run4/fidelity.csv \\
        experiments/fidelity/results/fidelity.csv experiments/fidelity/results-run6-pinned/fidelity.csv \\
        experiments/fidelity/results-run7/fidelity.csv experiments/fidelity/results-run8/fidelity.csv \\
        --exclude-two-instance results-run6-pinned,results-run7 --out experiments/fidelity/repeatability/pooled_p99.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.raw_runs import require  # noqa: E402


def pooled(tables: dict[str, pd.DataFrame], exclude_two_instance=(), predictions: str | None = None) -> pd.DataFrame:
    """One row per cell seen in every table's selection: predicted, live runs, median, error.
    ``predictions``: take the prediction from that table alone (a model newer than the
    older tables' analyses; the traces are the same in every run)."""
    pred, meas, inst = {}, {}, {}
    for name, t in tables.items():
        t = t.set_index("cell")
        if name in exclude_two_instance:
            t = t[t.instances == 1]
        pred[name], meas[name] = t.p99_predicted, t.p99_measured
        inst.update(t.instances.to_dict())
    pred, meas = pd.DataFrame(pred), pd.DataFrame(meas)
    if predictions is not None:
        pred = pred[[predictions]]
    out = pd.DataFrame({"instances": pd.Series(inst), "p99_predicted": pred.median(axis=1),
                        "runs": meas.notna().sum(axis=1), "p99_live_median": meas.median(axis=1),
                        "p99_live_min": meas.min(axis=1), "p99_live_max": meas.max(axis=1)})
    out["p99_err_pct"] = (out.p99_predicted / out.p99_live_median - 1) * 100
    out["within_live_range"] = (out.p99_predicted >= out.p99_live_min) & (out.p99_predicted <= out.p99_live_max)
    # The live system as its own predictor: each run against the median of the others. A
    # model cannot be held to a tighter error than the measurement repeats to.
    out["live_loo_median_pct"], out["live_loo_worst_pct"] = zip(*(leave_one_out(row.dropna().to_numpy())
                                                                  for _, row in meas.iterrows()))
    for name in meas:
        out[f"p99_{name}"] = meas[name]
    out.index.name = "cell"
    return out[out.runs >= 2].sort_index()


def leave_one_out(p99s) -> tuple[float, float]:
    """Median and largest |run / median of the other runs - 1|, in percent (NaN under 2 runs)."""
    if len(p99s) < 2:
        return float("nan"), float("nan")
    errs = [abs(p99s[i] / np.median(np.delete(p99s, i)) - 1) * 100 for i in range(len(p99s))]
    return float(np.median(errs)), float(max(errs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", type=Path, help="analysis tables (fidelity.csv), one per live run")
    ap.add_argument("--model", default="e", help="prediction rows to use (the profile column; e: the default model)")
    ap.add_argument("--exclude-two-instance", default="", help="comma-separated run names (a table's folder)")
    ap.add_argument("--cells", default="", help="comma-separated substrings: summarize only matching cells")
    ap.add_argument("--predictions", help="take every prediction from this run's table (its folder name; "
                                           "a repeat within it is FOLDER~rK): "
                                           "the older tables were analysed with an older model")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    require(*args.tables)
    tables = {}
    for path in args.tables:
        t = pd.read_csv(path)
        if args.predictions is not None and path.parent.name != args.predictions.split("~")[0]:
            # Only its live side is used, the same in every model's rows.
            t = t.drop_duplicates("cell")
        else:
            t = t[t.profile == args.model]
        if t.empty:
            continue
        # Repeats within one run (run_h200.py --repeat: NAME~rK) count as runs of their own.
        base, _, repeat = t.cell.str.partition("~r").T.to_numpy()
        for k in sorted(set(repeat)):
            tables[path.parent.name + (f"~r{k}" if k else "")] = t[repeat == k].assign(cell=base[repeat == k])
    table = pooled(tables, set(filter(None, args.exclude_two_instance.split(","))), args.predictions)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.round(3).to_string())
    shown = table
    if args.cells:
        shown = table[[any(k in c for k in args.cells.split(",")) for c in table.index]]
    for n, t in shown.groupby("instances"):
        e = t.p99_err_pct.abs()
        print(f"{n} instance(s), {len(t)} cells: p99 error against the live median: median {e.median():.1f}%, "
              f"worst {e.max():.1f}% ({e.idxmax()}); within 3%: {(e <= 3).sum()}, within 8%: {(e <= 8).sum()}; "
              f"prediction inside the live range: {int(t.within_live_range.sum())}")
        print(f"   one live run against the median of the others (the same cells): median over cells "
              f"{t.live_loo_median_pct.median():.1f}%, worst {t.live_loo_worst_pct.max():.1f}%")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
