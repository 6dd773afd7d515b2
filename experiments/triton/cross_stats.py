"""Does a cost table from live traffic predict Triton better than the closed-loop profile?

For each one-instance cell of a grid (``run_h200.py``), Triton's own batch_stats of the
three runs of one cell (pooled) become a cost table the way a user's server statistics
would (``schedsim profile import``), and predict the *other* configuration's cells at the
same and at the other load. The imported table covers the sizes that traffic formed, with
means only, so it is applied as per-size ratios to the closed-loop table
(``--profile``; sizes the traffic formed 10 times or more; larger sizes take the ratio of
the largest covered one), keeping that table's spread, wake curve and dispatch terms.
Compared: Triton's server-side mean (its statistics) against the simulator's mean.

    python experiments/triton/cross_stats.py --profile profiles/bert-base-fp16-triton-http-h200.csv \\
        --grid GRID.jsonl --out experiments/triton/results/cross_stats_h200.csv
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyze import server_mean_ms, simulate_cell  # noqa: E402
from schedsim.cost.profile import load_profile, save_profile  # noqa: E402
from schedsim.triton.stats import import_profile  # noqa: E402

MIN_EXECUTIONS = 10


def stats_document(runs: list[dict], model: str) -> dict:
    """Triton's /v2/models/NAME/stats body for the batch_stats of ``runs`` added together."""
    pooled: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for run in runs:
        for b, stages in run["triton_delta"]["batch_stats"].items():
            for stage, v in stages.items():
                pooled[int(b)][stage][0] += v["count"]
                pooled[int(b)][stage][1] += v["ns"]
    return {"model_stats": [{"name": model, "version": "1", "batch_stats": [
        {"batch_size": b, **{k: {"count": c, "ns": ns} for k, (c, ns) in st.items()}} for b, st in sorted(pooled.items())]}]}


def ratio_table(closed: Path, imported: Path, out: Path) -> dict:
    """``closed`` with each size's times scaled by imported/closed; the ratios used."""
    base, imp = load_profile(closed), load_profile(imported)
    seq = int(base.seq_lens[0])
    live = imp.table.astype({"batch": int, "n": int}).set_index("batch")
    table = base.table.copy()
    ratios = {int(b): float(live.loc[b, "latency_ms_mean"]) / float(m)
              for b, m in zip(table["batch"], table["latency_ms_mean"])
              if b in live.index and live.loc[b, "n"] >= MIN_EXECUTIONS}
    largest = max(ratios)
    samples = dict(base.samples) if base.samples else None
    for i, b in enumerate(table["batch"]):
        r = ratios.get(int(b), ratios[largest] if b > largest else 1.0)
        for col in [c for c in table.columns if c.startswith("latency_ms_")]:
            table.loc[i, col] *= r
        if samples:
            samples[(int(b), seq)] = samples[(int(b), seq)] * r
    save_profile(table, dict(base.meta), out, samples)
    return ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, required=True, help="the closed-loop table (schedsim profile --backend triton)")
    ap.add_argument("--grid", type=Path, nargs="+", required=True)
    ap.add_argument("--replications", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    cells = defaultdict(list)
    for g in args.grid:
        for line in g.read_text().splitlines():
            run = json.loads(line)
            if run["instances"] == 1:
                cells[(run["config"], run["load"])].append(run)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tables = {("closed-loop profile", None): args.profile}
        for (config, load), runs in sorted(cells.items()):
            stats = tmp / f"stats-{config}-{load:g}.json"
            stats.write_text(json.dumps(stats_document(runs, "bert_base")))
            imported = tmp / f"imported-{config}-{load:g}.csv"
            import_profile(str(stats), imported)
            tables[(config, load)] = tmp / f"ratio-{config}-{load:g}.csv"
            ratios = ratio_table(args.profile, imported, tables[(config, load)])
            print(f"{config} at {load:g}: live/profile by size {ratios}", flush=True)
        for (config, load), runs in sorted(cells.items()):
            live = float(np.median([server_mean_ms(r["triton_delta"]) for r in runs]))
            for (source, source_load), table in tables.items():
                if source == config:
                    continue  # a cell is never predicted from its own configuration's statistics
                sim = simulate_cell(runs[0], table, args.replications, tmp)
                rows.append({"config": config, "load": load, "table_from": source, "table_load": source_load,
                             "live_server_mean_ms": round(live, 4), "sim_server_mean_ms": round(sim["mean_ms"], 4),
                             "err_pct": round(100 * (sim["mean_ms"] - live) / live, 2),
                             "live_mean_batch": float(np.median([r["summary"]["mean_batch_size"] for r in runs])),
                             "sim_mean_batch": round(sim["mean_batch_size"], 3)})
                print(f"{config} {load:g} from {source} {source_load}: live {live:.2f} sim {sim['mean_ms']:.2f} "
                      f"({rows[-1]['err_pct']:+.1f}%)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
