"""The pair grid's service times on the live schedule: is a batch's time right, given what ran beside it?

For each multi-instance cell of a run (run_h200.py's output), every live batch is re-priced
by the model: its time alone (the committed one-instance table's mean plus dispatch
overhead) is worked off at rate 1 while no other instance ran a batch and at 1 / (1 + the
sum of slowdown(own, other) - 1 over the others' running batches) otherwise, with the other
instances' batches as the live run logged them (schedsim.core.contention's processor sharing, on the live timeline). This separates
the service-time model from the queueing: the simulation's schedule drifts from the live
one, this does not. Prints, per batch-size bin, the live and modelled median durations and
the ratio of their sums, and the ratio over all batches (the GPU time the model charges
for the live schedule over what it took). No wake-up cost is added (launches after idle
are priced as busy ones).

    python experiments/fidelity/diagnose_pair_replay.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.raw_runs import require  # noqa: E402

from experiments.fidelity.analyze import live_result  # noqa: E402
from schedsim.core.contention import PairSlowdown  # noqa: E402
from schedsim.cost.model import CostModel  # noqa: E402
from schedsim.cost.profile import load_profile  # noqa: E402

BINS = [(1, 2), (3, 8), (9, 16), (17, 32), (33, 64)]


def modelled_durations_ms(live, cost: CostModel, pairs: PairSlowdown) -> np.ndarray:
    """Each live batch's time by the grid on the live schedule: its time alone worked off at
    1 / (1 + the excesses of the other instances' batches running), segment by segment."""
    s, e, inst, n = live.batch_start_ns, live.batch_end_ns, live.batch_instance, live.batch_samples
    out = np.empty(len(s))
    for k in range(len(s)):
        other = np.flatnonzero(inst != inst[k])
        os_, oe, on = s[other], e[other], n[other]
        work, t = cost.mean_s(int(n[k]), 128) * 1e9, float(s[k])
        # the others' batches that can overlap this one, and the instants where the set changes
        near = (oe > t) & (os_ < t + 20 * work)
        os_, oe, on = os_[near], oe[near], on[near]
        cuts = sorted(c for c in set(os_.tolist()) | set(oe.tolist()) if c > t)
        for cut in cuts + [np.inf]:
            running = (os_ <= t) & (oe > t)
            rate = 1.0 / (1.0 + sum(pairs.slowdown(int(n[k]), int(c)) - 1.0 for c in on[running]))
            step = min(work / rate, cut - t)
            work, t = work - step * rate, t + step
            if work <= 1e-6:
                break
        out[k] = (t - s[k]) / 1e6
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    require(*args.runs)
    cost = CostModel.from_profile(load_profile(ROOT / "profiles" / "bert-base-fp16-cg-h200.csv"))
    pairs = PairSlowdown.from_meta(load_profile(ROOT / "profiles" / "bert-base-fp16-cg-2inst-h200.csv").meta,
                                   "bert-base-fp16-cg-2inst-h200")
    for run in args.runs:
        for cell in sorted((run / "cells").iterdir()):
            if not (cell / "summary.json").exists():
                continue
            if json.loads((cell / "summary.json").read_text())["config"]["instances"] < 2:
                continue
            _, live = live_result(cell)
            lived = (live.batch_end_ns - live.batch_start_ns) / 1e6
            model = modelled_durations_ms(live, cost, pairs)
            parts = []
            for lo, hi in BINS:
                m = (live.batch_samples >= lo) & (live.batch_samples <= hi)
                if m.any():
                    parts.append(f"{lo}-{hi}: {np.median(lived[m]):.3f}/{np.median(model[m]):.3f} "
                                 f"({model[m].sum() / lived[m].sum():.3f})")
            print(f"{run.name}/{cell.name}: all {model.sum() / lived.sum():.3f} | " + " | ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
