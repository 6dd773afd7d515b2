"""Live eager steps at token counts new to the engine, early and late in each cell.

The cells run in order on one engine, so a step's token count is *new* when no earlier
step of the run (this cell's or an earlier cell's) had it. For each cell: the median error
of the step model (the committed profile, or --profile) on eager steps of up to 1,024
tokens, new and repeated counts apart, in the cell's first and last third of eager steps.
The light-load cell's new counts were priced 28-38% low in its first third and
between 14% low and 12% high in its last (runs 7, 9, 11, 12): a cost spent early in the
process (fidelity-llm README).

    python experiments/fidelity-llm/new_counts.py experiments/fidelity-llm/run7 experiments/fidelity-llm/run9
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import analyze  # noqa: E402
from experiments.raw_runs import require  # noqa: E402

SHORT = 1024
"""Eager steps of at most this many tokens: bound by their launches."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run_h200.py output folders (runN/)")
    ap.add_argument("--profile", type=Path, help="step profile (default: the committed one)")
    args = ap.parse_args(argv)
    require(*args.runs)
    from schedsim.cost.step_model import StepCostModel
    from schedsim.cost.step_profile import load_step_profile

    cost = StepCostModel.from_profile(load_step_profile(args.profile or analyze.PROFILE))
    cells = [c["name"] for c in analyze.load_cells().CELLS]
    print("run | cell | short new, first third | last third | short repeated, first third | last third   (median error %, steps)")
    for run in args.runs:
        seen: set[int] = set()
        for cell in cells:
            p = analyze.priced_steps(run / "cells" / cell / "live_steps.csv", cost)
            if p is None:
                continue
            eager = ~p["graph"]
            tokens, err = p["tokens"][eager], p["err"][eager]
            new = np.zeros(tokens.size, dtype=bool)
            for i, t in enumerate(tokens.tolist()):
                new[i] = t not in seen
                seen.add(t)
            third = np.arange(tokens.size) * 3 // max(tokens.size, 1)   # 0, 1, 2: which third of the cell
            short = tokens <= SHORT

            def med(mask):
                return f"{np.median(err[mask]):+.0f}% ({mask.sum()})" if mask.any() else "-"

            print(f"{run.name} | {cell} | {med(short & new & (third == 0))} | {med(short & new & (third == 2))} | "
                  f"{med(short & ~new & (third == 0))} | {med(short & ~new & (third == 2))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
