"""Mooncake's eager steps run 16-17% over their price in every run: is it the serial-keys slope?

The committed step model prices an eager step's decode attention at 0.40 µs per serial key
(schedsim.cost.step_fit.serial_keys), fitted to a profile whose decode compositions sit beside
2,048-token chunks; measured apart, beside an 8,192-token chunk, one serial key cost 1.03 µs
(experiments/llm_profile/few-decodes/). This prints, per recorded run and cell, the median
error of the live eager steps (predicted - measured, % of measured) with the committed model,
then with EXTRA ms per 1,000 serial keys added to the eager steps of more than MIN_TOKENS
tokens (default the knee, EAGER_KNEE_TOKENS) whose decode attention leaves multiprocessors idle (decode rows x KV heads
x splits below the multiprocessor count): a what-if on the step prices, not a refit. And the
Mooncake cell's residuals (measured - predicted) by serial keys.

    python experiments/fidelity-llm/diagnose_serial_slope.py --extra 0.6
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from experiments.raw_runs import require  # noqa: E402

from schedsim.cost.step_fit import EAGER_KNEE_TOKENS, gpu_bound_serial_keys, serial_keys  # noqa: E402
from schedsim.cost.step_model import StepCostModel  # noqa: E402
from schedsim.cost.step_profile import load_step_profile  # noqa: E402

RUNS = ("run7", "run9", "run11", "run12", "run13")


def _analyze():
    spec = importlib.util.spec_from_file_location("fidelity_llm_analyze", HERE / "analyze.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extra", type=float, default=0.6, help="ms per 1,000 serial keys added (what-if)")
    ap.add_argument("--min-tokens", type=int, default=EAGER_KNEE_TOKENS,
                    help="add it to eager steps of more tokens than this (default: the knee)")
    args = ap.parse_args(argv)
    require(*(HERE / run for run in RUNS))
    an = _analyze()
    profile = load_step_profile(an.PROFILE)
    cost = StepCostModel.from_profile(profile)
    att, bs = cost._attention, cost.block_size
    # The what-if's steps are the ones gpu_bound_serial_keys counts, at --min-tokens.
    what_if = dataclasses.replace(att, gpu_bound_tokens=args.min_tokens)
    medians = {0.0: [], args.extra: []}
    moon = []
    for run in RUNS:
        line = {0.0: [], args.extra: []}
        for cell in sorted((HERE / run / "cells").iterdir()):
            log = cell / "live_steps.csv.gz"
            priced = an.priced_steps(log, cost)
            if priced is None:
                continue
            steps = pd.read_csv(log)
            steps = steps[(steps.status == "ok") & steps.gpu_ms.notna()].reset_index(drop=True)
            eager = ~priced["graph"]
            rows = steps.decode_rows.to_numpy(np.int64)
            width = np.where(rows > 0, -(-(steps.decode_max_context.to_numpy(np.int64) + 1) // bs) * bs, 0)
            bound = eager * gpu_bound_serial_keys(steps.tokens.to_numpy(np.int64), rows, width, what_if, bs)
            for extra in (0.0, args.extra):
                pred = priced["pred"] + bound * extra / 1e3
                err = (pred - priced["meas"]) / priced["meas"] * 100
                m = float(np.median(err[eager])) if eager.any() else float("nan")
                line[extra].append(f"{cell.name}:{m:+.1f}")
                medians[extra].append(abs(m))
            if cell.name == "mooncake-prefix":
                moon.append(pd.DataFrame({"serial_k": serial_keys(rows, width, att, bs)[eager] / 1e3,
                                          "resid_ms": (priced["meas"] - priced["pred"])[eager]}))
        for extra in (0.0, args.extra):
            print(f"{run} +{extra:g} ms/1k serial keys: " + " ".join(line[extra]))
    for extra in (0.0, args.extra):
        print(f"median |eager step error| over cells and runs, +{extra:g}: {np.nanmedian(medians[extra]):.1f}%")
    m = pd.concat(moon)
    bins = pd.cut(m.serial_k, [-0.1, 0.1, 12, 17, 25, 32])
    print("mooncake-prefix, all runs: residual (measured - predicted, ms) by serial keys (thousands):")
    print(m.groupby(bins, observed=True).resid_ms.describe()[["count", "50%", "min", "max"]].round(1).to_string())
    slope = np.polyfit(m.serial_k, m.resid_ms, 1)
    print(f"least-squares line: residual = {slope[1]:.1f} ms + {slope[0]:.2f} ms per 1,000 serial keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
