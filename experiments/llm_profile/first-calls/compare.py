"""Does pricing an eager step's first call of a token count help the LLM table?

The first time the engine runs an eager step of a token count it costs more (the GEMMs'
kernels are chosen for the new shape; `experiments/fidelity-llm/diagnose_first_call_distance.py`:
+3.3 ms at the median, 0.05 ms at a count run before). The step profiler now measures it
(sidecar ``first_call``, a phase of new counts timed twice) and counts each composition's
samples at new counts (``fresh_samples``); ``schedsim.cost.step_model`` can price it (the first
step of each new token count pays ``first_call.ms``, the fit aims at the price of a count
run before) when the sidecar sets ``first_call.priced``. Two profiles were measured with
it, on a slow host (fastest vCPU 1.49 ms per probe loop) and a fast one (1.08 ms); each is
scored unpriced and priced on live runs 7, 9, 11 and 12, beside the committed profile
(measured at 1.12 ms, without the phase).

    python experiments/llm_profile/first-calls/compare.py   # ~3 minutes
    python experiments/llm_profile/first-calls/compare.py --runs run7,run9,run11,run12,run13
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "few-decodes"))

from compare_profiles import scores, variant  # noqa: E402
from experiments.raw_runs import require  # noqa: E402

RUNS = ("run7", "run9", "run11", "run12")
PROFILES = {"committed": ROOT / "profiles" / "llama-1b-bf16-h200-steps.csv",
            "slow host": HERE / "llama-1b-bf16-h200-steps-slowhost.csv",
            "fast host": HERE / "llama-1b-bf16-h200-steps-fasthost.csv"}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=",".join(RUNS), help="live runs to score on (experiments/fidelity-llm/runN)")
    runs = tuple(ap.parse_args(argv).runs.split(","))
    require(*PROFILES.values(), *(ROOT / "experiments" / "fidelity-llm" / run for run in runs))
    print("profile | first call | held-out % | live step error p50 eager / graph, median over cells (runs "
          f"{', '.join(r[3:] for r in runs)}) | table median error | against the {len(runs)} runs' median: median, within 5%")
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in PROFILES.items():
            meta = json.loads(src.with_suffix(".json").read_text())
            print(f"{name} | not priced | {scores(src, runs, Path(tmp))}", flush=True)
            if meta.get("first_call"):
                ms = meta["first_call"]["ms"]
                priced = variant(src, Path(tmp) / name.replace(" ", "-"), "first_call", priced=True)
                print(f"{name} | {ms:.2f} ms | {scores(priced, runs, Path(tmp))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
