"""What the few-decode compositions show, and why the step model does not take them yet.

1. The eager decode-attention cost of few decodes over a long context: each 8,192-token
   chunk + decodes composition less the chunk alone, by decode rows and context, beside
   the attention's *serial keys* (keys one kernel block sweeps: the width over the split,
   times the waves of (row, KV head, split) blocks over the GPU's multiprocessors).
2. The linear step model (schedsim.llm.cost) fitted to the committed profile and to this
   one, with and without a serial-keys feature: held-out error, and the median error of
   the live eager and graph steps of fidelity-llm runs 7 and 9 (pinned, fast hosts).

    python experiments/llm_profile/few-decodes/analyze.py
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from schedsim.llm import cost as C  # noqa: E402
from schedsim.llm.shapes import context_blocks_array, graph_batch_array  # noqa: E402

PROFILE = HERE / "llama-1b-bf16-h200-steps-run10call.csv"
COMMITTED = ROOT / "profiles" / "llama-1b-bf16-h200-steps.csv"
RUNS = [ROOT / "experiments" / "fidelity-llm" / r for r in ("run7", "run9")]


def engine_settings(sidecar: Path) -> dict:
    m = json.loads(sidecar.read_text())
    return {"kv_heads": 8,  # llama-1b: 32 heads / 8 KV heads (model_description)
            "split_ctas": m["engine"]["decode_split_ctas"], "min_split_blocks": m["engine"]["min_split_blocks"],
            "sms": m["machine"]["gpu_multiprocessors"]}


def splits(b: int, width_blocks: int, e: dict) -> int:
    """PagedLLMEngine.decode_splits, restated."""
    s = 1
    if b * e["kv_heads"] > e["split_ctas"] // 8:
        return 1
    while (b * e["kv_heads"] * s * 2 <= e["split_ctas"] and width_blocks % (2 * s) == 0
           and width_blocks // (2 * s) >= e["min_split_blocks"]):
        s *= 2
    return s


def serial_keys(decodes, dwidth, graph, e: dict, bs: int = 16) -> np.ndarray:
    out = np.zeros(len(decodes))
    for i, (b, w, g) in enumerate(zip(decodes, dwidth, graph)):
        if g or b == 0:
            continue
        s = splits(int(b), int(w) // bs, e)
        out[i] = -(-(int(b) * e["kv_heads"] * s) // e["sms"]) * (w / s)
    return out


def fit(df: pd.DataFrame, e: dict, serial: bool):
    from scipy.optimize import nnls
    cols = {c: df[c].to_numpy() for c in df.columns}
    summary = C.profile_summaries(cols, 16, C.CUDA_GRAPH_BATCH_SIZES)
    X = C.feature_matrix(cols, 16, C.CUDA_GRAPH_BATCH_SIZES)
    if serial:
        X = np.c_[X, serial_keys(cols["decode_seqs"], summary[8], summary[0], e)]
    _, y = C.fit_target(cols)
    held = C.heldout_rows(len(df))
    A = X[~held] / y[~held, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(A / scale, np.ones(int((~held).sum())), maxiter=50 * X.shape[1])
    coef = coef / scale
    return coef, float(np.mean(np.abs(X[held] @ coef - y[held]) / y[held]) * 100)


def live_errors(run: Path, coef, e: dict, serial: bool) -> dict:
    out = {}
    for cell in sorted((run / "cells").iterdir()):
        with gzip.open(cell / "live_steps.csv.gz", "rt") as f:
            s = pd.read_csv(f)
        s = s[(s.status == "ok") & s.gpu_ms.notna()]
        g = s.graph.astype(bool).to_numpy().astype(np.int64)
        top = s.decode_max_context.to_numpy() + 1
        padded = np.where(g == 1, graph_batch_array(s.n_rows.to_numpy(), C.CUDA_GRAPH_BATCH_SIZES), 0)
        width = np.where(g == 1, context_blocks_array(np.maximum(top, 1), 16) * 16, 0)
        dwidth = np.where(s.decode_rows.to_numpy() > 0, -(-top // 16) * 16, 0)
        kv = C.real_kv_tokens(s.decode_rows.to_numpy(), s.decode_kv_tokens.to_numpy(), 16)
        feats = C.step_features(g, padded, width, s.tokens.to_numpy(), s.prefill_rows.to_numpy(),
                                s.prefill_attention.to_numpy(), s.prefill_context.to_numpy(),
                                s.decode_rows.to_numpy(), dwidth, kv)
        X = np.column_stack([np.broadcast_to(np.asarray(f, dtype=float), (len(s),)) for f in feats])
        if serial:
            X = np.c_[X, serial_keys(s.decode_rows.to_numpy(), dwidth, g, e)]
        err = (X @ coef - s.engine_ms.to_numpy()) / s.engine_ms.to_numpy() * 100
        out[cell.name] = (float(np.median(err[g == 0])), float(np.median(err[g == 1])))
    return out


def main() -> int:
    e = engine_settings(PROFILE.with_suffix(".json"))
    p = pd.read_csv(PROFILE)
    alone = p[(p.prefill_chunk == 8192) & (p.prefill_context == 0) & (p.decode_seqs == 0)].latency_ms_mean.iloc[0]
    few = p[(p.prefill_chunk == 8192) & (p.prefill_context == 0) & (p.decode_seqs > 0)].copy()
    few["decode_extra_ms"] = few.latency_ms_mean - alone
    few["width_blocks"] = -(-(few.decode_context + 1) // 16)
    few["split"] = [splits(b, w, e) for b, w in zip(few.decode_seqs, few.width_blocks)]
    few["serial_keys"] = serial_keys(few.decode_seqs.to_numpy(), few.width_blocks.to_numpy() * 16,
                                     np.zeros(len(few), int), e)
    print(f"8,192-token chunk alone: {alone:.1f} ms; with decodes (extra ms, then serial keys):")
    print(few.pivot_table(index="decode_context", columns="decode_seqs", values="decode_extra_ms").round(1).to_string())
    print(few.pivot_table(index="decode_context", columns="decode_seqs", values="serial_keys").astype(int).to_string())
    k = np.polyfit(few.serial_keys, few.decode_extra_ms, 1)
    print(f"least squares: extra = {k[1]:.2f} ms + {k[0] * 1e3:.3f} ms per 1,000 serial keys\n")
    print("model | fit held-out % | live eager / graph step error, median per cell (run 7; run 9)")
    for label, path in (("committed profile", COMMITTED), ("with few decodes", PROFILE)):
        df = pd.read_csv(path)
        for serial in (False, True):
            coef, held = fit(df, e, serial)
            cells = [live_errors(r, coef, e, serial) for r in RUNS]
            text = "; ".join(" ".join(f"{v[0]:+.0f}/{v[1]:+.0f}" for v in c.values()) for c in cells)
            print(f"{label}{' + serial keys' if serial else ''}: {held:.2f} | {text}")
    print("cells:", " ".join(c.name for c in sorted((RUNS[0] / "cells").iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
