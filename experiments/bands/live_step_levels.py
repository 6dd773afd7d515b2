"""What moved between two live LLM runs of the same cells: the engine's steps, by part.

For each cell of the LLM fidelity table, the recorded step logs of live runs 7 and 9 (two
H200 machines; ``tests/data/fidelity_llm/run7``, ``run9``: every step's composition, its
CUDA-event time ``gpu_ms`` and the engine call's host time ``engine_ms``) give, per run:
the median CUDA-event time of graph decode steps by batch size (their ratio, run 9 over
run 7, median over the sizes both ran), of eager steps of up to 1,024 tokens and of more
than 4,096, the median host time around a step beyond its CUDA-event time, and the median
serving-loop gap between one engine call's end and the next one's start; and the spread of
graph steps of one shape within a run (median over shapes with more than 20 steps of
std/mean). A diagnostic of what a band would have to draw, not an input to one.

    python experiments/bands/live_step_levels.py --out experiments/bands/live_step_levels.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from csv_out import write_csv  # experiments/bands, the script's own folder

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "fidelity_llm"
RUNS = ("run7", "run9")


def one_run(path: Path) -> dict:
    d = pd.read_csv(path)
    d = d[d.status == "ok"]
    host_ms = d.engine_ms - d.gpu_ms
    loop_ms = (d.start_s.shift(-1) - d.start_s) * 1e3 - d.engine_ms
    loop_ms = loop_ms[(loop_ms >= 0) & (loop_ms < 5)]   # back-to-back steps, not idle gaps
    graph, eager = d[d.graph], d[~d.graph]
    shapes = graph.groupby(["n_rows", graph.decode_max_context // 512]).gpu_ms
    cv = shapes.agg(lambda x: x.std() / x.mean() if len(x) > 20 else np.nan)
    return {"graph_ms": graph.groupby("n_rows").gpu_ms.median(),
            "eager_small_ms": eager[eager.tokens <= 1024].gpu_ms.median(),
            "eager_large_ms": eager[eager.tokens > 4096].gpu_ms.median(),
            "host_ms": float(host_ms.median()), "loop_ms": float(loop_ms.median()),
            "graph_cv": float(cv.median())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for cell in sorted(p.name for p in (DATA / RUNS[0] / "cells").iterdir()):
        a, b = (one_run(DATA / r / "cells" / cell / "live_steps.csv.gz") for r in RUNS)
        both = a["graph_ms"].index.intersection(b["graph_ms"].index)
        rows.append({"cell": cell, "graph_gpu_ratio": float(np.median(b["graph_ms"][both] / a["graph_ms"][both])),
                     "eager_small_gpu_ratio": b["eager_small_ms"] / a["eager_small_ms"],
                     "eager_large_gpu_ratio": b["eager_large_ms"] / a["eager_large_ms"],
                     "host_ms_run7": a["host_ms"], "host_ms_run9": b["host_ms"],
                     "host_ratio": b["host_ms"] / a["host_ms"],
                     "loop_ms_run7": a["loop_ms"], "loop_ms_run9": b["loop_ms"],
                     "loop_ratio": b["loop_ms"] / a["loop_ms"],
                     "graph_cv_run7": a["graph_cv"], "graph_cv_run9": b["graph_cv"]})
    df = pd.DataFrame(rows)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for col in ("graph_gpu_ratio", "eager_small_gpu_ratio", "eager_large_gpu_ratio", "host_ratio", "loop_ratio"):
        v = df[col].dropna()
        print(f"{col}: {v.min():.3f}-{v.max():.3f} (median {v.median():.3f})")
    write_csv(df, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
