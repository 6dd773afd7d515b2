"""How far the step profile's level moves between machines and hours, against what the LLM
band's per-run level (``schedsim.run.llm_bands.StepSpread``) reads from one profile's drift.

Six more step profiles of the same grid were measured on H200 machines on 2026-11-30 beside
the bundled one (experiments/RUNS.md, ``experiments/llm_profile/``, commit c4622d1f0791, read
with ``git show``). For each: the median over compositions of its mean over the bundled
profile's, apart for CUDA-graph decode and eager steps, and the per-run level its own drift
record gives. Those profiles were pinned to the fastest vCPU (one unpinned) and time
CUDA-event step times, as the bundled one does: what moves the serving loop's host time is
not in them.

    python experiments/bands/step_profile_levels.py --out experiments/bands/step_profile_levels.csv
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from schedsim.cost.step_profile import StepProfile  # noqa: E402
from schedsim.run.llm_bands import StepSpread  # noqa: E402
from csv_out import write_csv  # noqa: E402  (experiments/bands, the script's own folder)

RAW_COMMIT = "c4622d1f0791"
OTHERS = ("few-decodes/llama-1b-bf16-h200-steps-run10call", "few-decodes/llama-1b-bf16-h200-steps-run11call",
          "few-decodes/llama-1b-bf16-h200-steps-slowhost", "first-calls/llama-1b-bf16-h200-steps-fasthost",
          "first-calls/llama-1b-bf16-h200-steps-slowhost", "llama-1b-bf16-h200-steps-unpinned")
KEYS = ["prefill_seqs", "prefill_chunk", "prefill_context", "decode_seqs", "decode_context"]


def git_show(path: str) -> str:
    return subprocess.run(["git", "show", f"{RAW_COMMIT}:{path}"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def level_sigma(table: pd.DataFrame, meta: dict) -> float:
    cols = {k: table[k].to_numpy() for k in table.columns}
    spread = StepSpread.from_profile(StepProfile(columns=cols, meta=meta))
    return spread.level_sigma if spread else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    base = pd.read_csv(ROOT / "profiles/llama-1b-bf16-h200-steps.csv")
    base_meta = json.loads((ROOT / "profiles/llama-1b-bf16-h200-steps.json").read_text())
    graph_max = max(base_meta.get("cuda_graph_batch_sizes", [256]))
    rows = [{"profile": "profiles/llama-1b-bf16-h200-steps (bundled)", "date": base_meta.get("date"),
             "compositions": len(base), "graph_level_pct": 0.0, "eager_level_pct": 0.0,
             "drift_median_change_pct": 100 * base_meta["drift"]["median_change"],
             "level_sigma_from_drift": level_sigma(base, base_meta)}]
    for name in OTHERS:
        other = pd.read_csv(io.StringIO(git_show(f"experiments/llm_profile/{name}.csv")))
        meta = json.loads(git_show(f"experiments/llm_profile/{name}.json"))
        on = KEYS + (["decode_kv_tokens"] if "decode_kv_tokens" in other and "decode_kv_tokens" in base else [])
        m = base.merge(other, on=on, suffixes=("", "_o"))
        ratio = np.log(m["latency_ms_mean_o"] / m["latency_ms_mean"])
        graph = (m.prefill_seqs == 0) & (m.decode_seqs <= graph_max)
        rows.append({"profile": name, "date": meta.get("date"), "compositions": len(m),
                     "graph_level_pct": 100 * float(np.expm1(np.median(ratio[graph]))),
                     "eager_level_pct": 100 * float(np.expm1(np.median(ratio[~graph]))),
                     "drift_median_change_pct": 100 * float(meta.get("drift", {}).get("median_change", np.nan)),
                     "level_sigma_from_drift": level_sigma(other, meta)})
    df = pd.DataFrame(rows)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for kind in ("graph", "eager"):
        v = np.log1p(df[f"{kind}_level_pct"] / 100)
        print(f"{kind} steps: log-sd of the level over the {len(df)} profiles {float(np.std(v, ddof=1)):.4f}")
    print(f"per-run level from each profile's drift: median log-sd {df.level_sigma_from_drift.median():.4f}, "
          f"range {df.level_sigma_from_drift.min():.4f}-{df.level_sigma_from_drift.max():.4f}")
    write_csv(df, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
