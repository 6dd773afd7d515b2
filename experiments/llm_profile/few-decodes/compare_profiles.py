"""Does the extended grid, or 4 resident kernel blocks per multiprocessor, help?

Two step profiles (the committed one, and the extended grid of measure.py measured in live
run 11's device call on the same host, ``llama-1b-bf16-h200-steps-run11call``), each fitted
with ``decode_attention.blocks_per_multiprocessor`` 1 (a wave of decode-attention blocks is
132) and 4 (PyTorch's memory-efficient kernel is built for 16 warps per multiprocessor in
blocks of 4 warps: 4 x 132). For each: the fit's held-out error, the median error of the
live steps (eager / graph) and of the LLM fidelity table (``analyze.py``) on runs 7, 9 and
11, and the error against the median of the three runs (``pooled.py``).

    python experiments/llm_profile/few-decodes/compare_profiles.py   # ~6 minutes
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "fidelity-llm"))

from schedsim.cost.step_fit import fit_step_profile  # noqa: E402
from schedsim.cost.step_profile import ATTENTION_KEY, load_step_profile  # noqa: E402

import pooled  # noqa: E402
from experiments.raw_runs import require  # noqa: E402

PROFILES = {"committed": ROOT / "profiles" / "llama-1b-bf16-h200-steps.csv",
            "extended (run 11's call)": HERE / "llama-1b-bf16-h200-steps-run11call.csv"}
RUNS = ("run7", "run9", "run11")
FIDELITY = ROOT / "experiments" / "fidelity-llm"


def variant(src: Path, out: Path, key: str, **settings) -> Path:
    """A copy of the profile in ``out`` whose sidecar object ``key`` has ``settings`` set, and
    no stored fit (the model refits it)."""
    out.mkdir(parents=True)
    shutil.copy(src, out / src.name)
    meta = json.loads(src.with_suffix(".json").read_text())
    meta.pop("fit", None)
    meta[key] = dict(meta[key], **settings)
    (out / src.name).with_suffix(".json").write_text(json.dumps(meta))
    return out / src.name


def scores(path: Path, runs, tmp: Path) -> str:
    """' | '-joined: the fit's held-out error; the median over cells of the live steps' error
    p50 (eager / graph) per run; the table's median error per run (analyze.py); the error
    against the runs' median (pooled.py): its median and the figures within 5%."""
    import pandas as pd

    fit = fit_step_profile(load_step_profile(path))
    medians, steps, results = [], [], []
    for run in runs:
        res = tmp / f"res-{path.stem}-{run}"
        subprocess.run([sys.executable, str(FIDELITY / "analyze.py"), "--run", str(FIDELITY / run),
                        "--results", str(res), "--profile", str(path)], check=True, stdout=subprocess.DEVNULL)
        medians.append(json.loads((res / "summary.json").read_text())["latency_abs_err_pct_median"])
        t = pd.read_csv(res / "fidelity_llm.csv")
        steps.append(f"{t.step_eager_err_p50_pct.abs().median():.1f} / {t.step_graph_err_p50_pct.abs().median():.1f}")
        results.append(res)
    e = pooled.pooled(results).err_pct.abs()
    return (f"{fit.mape_pct:.2f} | {'; '.join(steps)} | {' / '.join(f'{m:.1f}' for m in medians)} | "
            f"{np.median(e):.1f}%, {(e <= 5).sum()} of {len(e)}")


def main() -> int:
    require(*PROFILES.values(), *(FIDELITY / run for run in RUNS))
    print("profile | resident blocks | held-out % | live step error p50 eager / graph, median over cells "
          "(runs 7, 9, 11) | table median error (runs 7, 9, 11) | against the 3 runs' median: median, within 5%")
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in PROFILES.items():
            for blocks in (1, 4):
                path = variant(src, Path(tmp) / f"{name[:8]}-{blocks}", ATTENTION_KEY,
                               blocks_per_multiprocessor=blocks)
                print(f"{name} | {blocks} | {scores(path, RUNS, Path(tmp))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
