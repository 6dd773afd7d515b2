"""What the few-decode compositions show, and why the step model does not take them yet.

1. The eager decode-attention cost of few decodes over a long context: each 8,192-token
   chunk + decodes composition less the chunk alone, by decode rows and context, beside
   the attention's *serial keys* (schedsim.cost.step_fit.serial_keys: keys one kernel block
   sweeps, times the waves of blocks over the GPU's multiprocessors).
2. The step model (schedsim.cost.step_model) fitted to the committed profile and to this one,
   with and without the serial-keys feature: held-out error, and the median error of the
   live eager and graph steps of fidelity-llm runs 7 and 9 (pinned, fast hosts).

    python experiments/llm_profile/few-decodes/analyze.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from experiments.raw_runs import require  # noqa: E402

from schedsim.cost.step_fit import serial_keys  # noqa: E402
from schedsim.cost.step_model import StepCostModel  # noqa: E402
from schedsim.cost.step_profile import ATTENTION_KEY, StepProfile, load_step_profile  # noqa: E402

PROFILE = HERE / "llama-1b-bf16-h200-steps-run10call.csv"
COMMITTED = ROOT / "profiles" / "llama-1b-bf16-h200-steps.csv"
RUNS = [ROOT / "experiments" / "fidelity-llm" / r for r in ("run7", "run9")]


def with_attention(path: Path, serial: bool) -> StepProfile:
    """The profile at ``path``, its sidecar's ``decode_attention`` set (from its own engine
    and machine entries; llama-1b has 8 KV heads) or removed, and no stored fit."""
    profile = load_step_profile(path)
    meta = {k: v for k, v in profile.meta.items() if k not in (ATTENTION_KEY, "fit")}
    if serial:
        meta[ATTENTION_KEY] = {"kv_heads": 8, "split_ctas": meta["engine"]["decode_split_ctas"],
                                 "min_split_blocks": meta["engine"]["min_split_blocks"],
                                 "multiprocessors": meta["machine"]["gpu_multiprocessors"]}
    return StepProfile(profile.columns, meta, path)


def step_errors_module():
    spec = importlib.util.spec_from_file_location("fidelity_llm_analyze", ROOT / "experiments/fidelity-llm/analyze.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.step_errors


def main() -> int:
    require(PROFILE, *RUNS)
    attention = with_attention(PROFILE, True).decode_attention
    p = pd.read_csv(PROFILE)
    alone = p[(p.prefill_chunk == 8192) & (p.prefill_context == 0) & (p.decode_seqs == 0)].latency_ms_mean.iloc[0]
    few = p[(p.prefill_chunk == 8192) & (p.prefill_context == 0) & (p.decode_seqs > 0)].copy()
    few["decode_extra_ms"] = few.latency_ms_mean - alone
    width = -(-(few.decode_context.to_numpy() + 1) // 16) * 16
    few["serial_keys"] = serial_keys(few.decode_seqs.to_numpy(np.int64), width.astype(np.int64), attention, 16)
    print(f"8,192-token chunk alone: {alone:.1f} ms; with decodes (extra ms, then serial keys):")
    print(few.pivot_table(index="decode_context", columns="decode_seqs", values="decode_extra_ms").round(1).to_string())
    print(few.pivot_table(index="decode_context", columns="decode_seqs", values="serial_keys").astype(int).to_string())
    k = np.polyfit(few.serial_keys, few.decode_extra_ms, 1)
    print(f"least squares: extra = {k[1]:.2f} ms + {k[0] * 1e3:.3f} ms per 1,000 serial keys\n")
    step_errors = step_errors_module()
    print("model | fit held-out % | live eager / graph step error, median per cell (run 7; run 9)")
    for label, path in (("committed profile", COMMITTED), ("with few decodes", PROFILE)):
        for serial in (False, True):
            model = StepCostModel.from_profile(with_attention(path, serial))
            cells = [[step_errors(cell / "live_steps.csv", model) for cell in sorted((r / "cells").iterdir())]
                     for r in RUNS]
            text = "; ".join(" ".join(f"{e['step_eager_err_p50_pct']:+.0f}/{e['step_graph_err_p50_pct']:+.0f}"
                                      for e in run) for run in cells)
            print(f"{label}{' + serial keys' if serial else ''}: {model.fit.mape_pct:.2f} | {text}")
    print("cells:", " ".join(c.name for c in sorted((RUNS[0] / "cells").iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
