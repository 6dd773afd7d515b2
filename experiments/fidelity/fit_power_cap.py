"""Fit a profile's ``power_cap`` (schedsim/cost/power.py) from diagnose_gpu_load.py's batches.

- ``factor`` per batch size B: the median CUDA-event time of the batch-32 probes in the
  ``steady-B`` phase over their median in the two ``mix`` phases (the profile's own
  loop). One reference batch in every phase, so only the GPU's state differs.
- ``tau_rise_ms``: the ``step-64`` phase (after ``step-32``), each batch's time over the
  phase's last-half median, fitted by least squares to f_end + (f_start - f_end) e^(-t/tau);
  ``tau_fall_ms``: the same for ``step-8`` (after ``step-64``).

    python experiments/fidelity/fit_power_cap.py experiments/fidelity/calibration/gpu_load/batches.csv \\
        [--write profiles/bert-base-fp16-cg-h200.json]

prints the fit, and with --write puts it into that sidecar as ``power_cap`` (with where it
came from); the sidecar's other keys are kept.
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

from experiments.raw_runs import require  # noqa: E402

from schedsim.cost.power import step_tau_ms  # noqa: E402

PROBE = 32
SIZES = (8, 16, 32, 48, 64)


def phase_tau_ms(b: pd.DataFrame, phase: str, size: int, start_factor: float) -> float:
    """Time constant (ms) of the approach to the phase's settled time (schedsim.cost.power.step_tau_ms)."""
    x = b[(b.phase == phase) & (b.batch == size)]
    y = x.gpu_ms.to_numpy()
    end = float(np.median(y[len(y) // 2:]))
    return step_tau_ms((x.t_s.to_numpy() - x.t_s.min()) * 1e3, y / end, start_factor)


def fit(b: pd.DataFrame) -> dict:
    mix = b[b.phase.str.startswith("mix") & (b.batch == PROBE)].gpu_ms
    ref = mix.median()
    factor = [round(float(b[(b.phase == f"steady-{s}") & (b.batch == PROBE)].gpu_ms.median() / ref), 4)
              for s in SIZES]
    f = dict(zip(SIZES, factor))
    # A step from 32s to 64s starts at the 32s' state, relative to where the 64s settle; and back.
    rise = phase_tau_ms(b, "step-64", 64, f[32] / f[64])
    fall = phase_tau_ms(b, "step-8", 8, f[64] / f[8])
    return {"batch": list(SIZES), "factor": factor, "tau_rise_ms": rise, "tau_fall_ms": fall, "table": "mix",
            "reference": f"batch-{PROBE} probes in the profile's mixed loop (median of {len(mix)})"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("batches", type=Path, help="diagnose_gpu_load.py's batches.csv")
    ap.add_argument("--write", type=Path, help="a profile sidecar to put the fit into")
    args = ap.parse_args(argv)
    require(args.batches)
    result = fit(pd.read_csv(args.batches))
    print(json.dumps(result, indent=2))
    if args.write:
        meta = json.loads(args.write.read_text())
        run = args.batches.parent / "run.json"
        meta["power_cap"] = result | {"source": f"experiments/fidelity/fit_power_cap.py {args.batches}",
                                      "measured": json.loads(run.read_text()) if run.exists() else None}
        args.write.write_text(json.dumps(meta, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
