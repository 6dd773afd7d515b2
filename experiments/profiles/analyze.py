"""Check two common claims against the committed H200 profiles, and the 2-instance effect.

    python experiments/profiles/analyze.py        # writes experiments/profiles/*.png, results.json

1. FP16 against FP32 (the claim: about 2x): mean latency fp32 / fp16 per batch and seq_len,
   with CUDA graphs (and eager).
2. CUDA graphs against eager launches at small batch: eager / graph mean latency.
3. Two instances on one GPU (fp16, graphs, seq 128): per-batch latency and throughput
   against one instance.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from schedsim.cost.profile import load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
P = {k: load_profile(ROOT / "profiles" / f"bert-base-{k}-h200.csv")
     for k in ("fp16-cg-3seq", "fp16-eager-3seq", "fp32-cg-3seq", "fp32-eager-3seq",
               "fp16-cg-2inst")}
SEQS = (32, 128, 384)
SHOW = (1, 8, 16, 32, 64)


def mean(key: str, seq: int) -> tuple[np.ndarray, np.ndarray]:
    t = P[key].table
    t = t[t["seq_len"] == seq]
    return t["batch"].to_numpy(), t["latency_ms_mean"].to_numpy()


def ratio(num: str, den: str, seq: int) -> tuple[np.ndarray, np.ndarray]:
    b, a = mean(num, seq)
    b2, c = mean(den, seq)
    assert (b == b2).all()
    return b, a / c


def main() -> None:
    results: dict = {}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, mode in zip(axes, ("cg", "eager")):
        for s in SEQS:
            b, r = ratio(f"fp32-{mode}-3seq", f"fp16-{mode}-3seq", s)
            ax.plot(b, r, marker=".", label=f"seq {s}")
            results[f"fp32_over_fp16_{mode}_seq{s}"] = {int(x): round(float(y), 3)
                                                        for x, y in zip(b, r) if x in SHOW}
        ax.axhline(2.0, color="k", ls="--", lw=0.8, label="seed's claim, 2x")
        ax.set(xlabel="batch size", title=f"FP32 / FP16 mean latency ({'CUDA graphs' if mode == 'cg' else 'eager'})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("speed-up of FP16")
    fig.suptitle("BERT-base on one H200, torch 2.11: FP16 vs FP32 (strict FP32, TF32 off)", fontsize=9)
    fig.tight_layout()
    fig.savefig(HERE / "fp16_vs_fp32.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, prec in zip(axes, ("fp16", "fp32")):
        for s in SEQS:
            b, r = ratio(f"{prec}-eager-3seq", f"{prec}-cg-3seq", s)
            ax.plot(b, r, marker=".", label=f"seq {s}")
            results[f"eager_over_cg_{prec}_seq{s}"] = {int(x): round(float(y), 3)
                                                       for x, y in zip(b, r) if x in SHOW}
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xlabel="batch size", title=f"eager / CUDA-graph mean latency, {prec}", xscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("eager / graphs")
    fig.suptitle("BERT-base on one H200: what CUDA graphs save", fontsize=9)
    fig.tight_layout()
    fig.savefig(HERE / "graphs_vs_eager.png", dpi=120)
    plt.close(fig)

    b1, l1 = mean("fp16-cg-3seq", 128)
    b2, l2 = mean("fp16-cg-2inst", 128)
    assert (b1 == b2).all()
    tp1, tp2 = b1 / l1 * 1e3, 2 * b2 / l2 * 1e3
    results["two_instances_fp16_cg_seq128"] = {
        int(b): {"latency_1inst_ms": round(float(x), 3), "latency_2inst_ms": round(float(y), 3),
                 "latency_ratio": round(float(y / x), 3),
                 "throughput_ratio": round(float(t2 / t1), 3)}
        for b, x, y, t1, t2 in zip(b1, l1, l2, tp1, tp2) if b in SHOW}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(b1, l1, ".-", label="1 instance")
    ax1.plot(b2, l2, ".-", label="2 instances (each batch, under contention)")
    ax1.set(xlabel="batch size", ylabel="mean latency per batch, ms", title="latency")
    ax2.plot(b1, tp1, ".-", label="1 instance")
    ax2.plot(b2, tp2, ".-", label="2 instances together")
    ax2.set(xlabel="batch size", ylabel="samples/s", title="throughput")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("BERT-base fp16, CUDA graphs, seq 128, one H200: two instances on two streams", fontsize=9)
    fig.tight_layout()
    fig.savefig(HERE / "two_instances.png", dpi=120)
    plt.close(fig)

    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    for k, v in results.items():
        print(k, v)


if __name__ == "__main__":
    main()
