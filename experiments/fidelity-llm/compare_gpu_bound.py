"""The GPU-bound serial-keys term (decode_attention.gpu_bound_tokens) against the recorded runs.

Builds four step profiles in a temporary folder: the committed one and run 11's extended one
(../llm_profile/few-decodes/, with the 64 few-decode compositions), each without and with
``gpu_bound_tokens`` in its sidecar's ``decode_attention`` (the model refits on load), then
for each runs ``analyze.py`` over the given runs and ``pooled.py`` over the results, and
prints the pooled summaries; with --out, keeps each pooled table there.

    python experiments/fidelity-llm/compare_gpu_bound.py --out experiments/fidelity-llm/repeatability/gpu-bound
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "llm_profile" / "few-decodes"))

from compare_profiles import variant  # noqa: E402
from experiments.raw_runs import require  # noqa: E402

from schedsim.cost.step_fit import fit_step_profile
from schedsim.cost.step_profile import load_step_profile  # noqa: E402

PROFILES = {"committed": ROOT / "profiles" / "llama-1b-bf16-h200-steps.csv",
            "extended": ROOT / "experiments" / "llm_profile" / "few-decodes" / "llama-1b-bf16-h200-steps-run11call.csv"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="run7,run9,run11,run12,run13,run14")
    ap.add_argument("--gpu-bound-tokens", type=int, default=2048)
    ap.add_argument("--out", type=Path, help="keep the pooled tables here")
    args = ap.parse_args(argv)
    runs = args.runs.split(",")
    require(*(HERE / run for run in runs), *PROFILES.values())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, src in PROFILES.items():
            for tokens in (0, args.gpu_bound_tokens):
                label = f"{name}-gb{tokens}"
                # No stored fit: the model refits with the term's feature when tokens > 0.
                profile = variant(src, tmp / label / "profile", "decode_attention",
                                  **({"gpu_bound_tokens": tokens} if tokens else {}))
                results = [tmp / label / run for run in runs]
                for run, res in zip(runs, results):
                    subprocess.run([sys.executable, str(HERE / "analyze.py"), "--run", str(HERE / run),
                                    "--results", str(res), "--profile", str(profile)],
                                   check=True, capture_output=True, text=True)
                pooled = tmp / f"pooled-{label}.csv"
                out = subprocess.run([sys.executable, str(HERE / "pooled.py"), *map(str, results), "--out", str(pooled)],
                                     check=True, capture_output=True, text=True).stdout
                fit = fit_step_profile(load_step_profile(profile))
                steps = pd.concat([pd.read_csv(r / "fidelity_llm.csv") for r in results])
                moon = steps[steps.cell == "mooncake-prefix"].step_eager_err_p50_pct
                print(f"== {label}: held-out {fit.mape_pct:.2f}%; live eager steps, median over cells and runs of "
                      f"|median error| {steps.step_eager_err_p50_pct.abs().median():.1f}%; mooncake-prefix's "
                      f"{moon.min():+.1f}..{moon.max():+.1f}%")
                print("\n".join(line for line in out.splitlines() if "runs," in line
                                or line.startswith(("  ", "one live"))), flush=True)
                if args.out:
                    args.out.mkdir(parents=True, exist_ok=True)
                    shutil.copy(pooled, args.out / f"pooled-{'-'.join([runs[0], runs[-1]])}-{label}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
