"""Check two pieces of batching advice on the committed H200 profile with ``schedsim sweep``.

1. "A batching window over 20 ms easily worsens p99": p99 against max_queue_delay_us from
   0 to 50 ms, at low, medium and high load, with Triton's default preferred size
   (= max_batch_size 64) and with preferred sizes 8/16/32.
2. "Dynamic batching raises throughput 5x at a mean batch of 6 to 12": the highest rate
   each policy keeps up with under a p99 bound, and the mean batch it forms there, for
   no batching and for the dynamic batcher.

    python experiments/batching_advice/run.py          # about 2 minutes on 2 cores

Writes results/<sweep>/{sweep.csv,best.json,*.png}, results/summary.json and the two
figures window_p99.png and throughput.png next to this file.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TRACE_RATE = 1000        # the trace is made at 1,000 req/s and replayed faster with rate_scale
REQUESTS = 50_000
LOADS = (2000, 8000, 14000)                                   # req/s: ~11%, 46%, 80% of capacity
DELAYS_US = "0,1000,2000,5000,10000,20000,30000,50000"
RATES = ",".join(str(r / TRACE_RATE) for r in range(1000, 20001, 1000))
NONE_RATES = ",".join(str(r / TRACE_RATE) for r in range(100, 2001, 100))  # none saturates near 1,600
P99_BOUND_MS = 10.0      # "keeps up": p99 under this (a loose, interactive-serving bound)


def schedsim(*args) -> None:
    cmd = [sys.executable, "-m", "schedsim.cli.main", *map(str, args)]
    print("$ schedsim " + " ".join(map(str, args)), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def rows(name: str) -> list[dict]:
    with open(RESULTS / name / "sweep.csv", newline="") as f:
        return list(csv.DictReader(f))


def main() -> None:
    RESULTS.mkdir(exist_ok=True)
    trace = RESULTS / "poisson_1000rps.csv"
    schedsim("trace", "gen", "--arrival", "poisson", "--rate", TRACE_RATE, "--n", REQUESTS, "--seed", 1,
             "--seq-len", "fixed:128", "--out", trace)
    for load in LOADS:
        schedsim("sweep", trace, "--policy", "dynamic", "--rate-scale", load / TRACE_RATE,
                 "--grid", f"max_queue_delay_us={DELAYS_US}", "--grid", "preferred_batch_size=none,8/16/32",
                 "--seed", 1, "--out", RESULTS / f"window_{load}rps")
    schedsim("sweep", trace, "--policy", "none", "--grid", f"rate_scale={NONE_RATES}",
             "--slo-p99-ms", P99_BOUND_MS, "--seed", 1, "--out", RESULTS / "rate_none")
    for delay in (0, 1000, 2000):
        schedsim("sweep", trace, "--policy", "dynamic", "--max-batch-size", 64, "--param",
                 f"max_queue_delay_us={delay}", "--grid", f"rate_scale={RATES}",
                 "--slo-p99-ms", P99_BOUND_MS, "--seed", 1, "--out", RESULTS / f"rate_dynamic_{delay}us")
    summarise()


def summarise() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary: dict = {"p99_bound_ms": P99_BOUND_MS, "window": {}, "throughput": {}}
    fig, axes = plt.subplots(1, len(LOADS), figsize=(12, 4), sharey=False)
    for ax, load in zip(axes, LOADS):
        table = rows(f"window_{load}rps")
        for pref in ("none", "8/16/32"):
            pts = sorted((int(r["max_queue_delay_us"]), float(r["p99_ms"]), float(r["mean_batch_size"]))
                         for r in table if r["preferred_batch_sizes"] == pref)
            summary["window"][f"{load}rps preferred={pref}"] = [
                {"delay_ms": d / 1000, "p99_ms": p, "mean_batch": b} for d, p, b in pts]
            ax.plot([d / 1000 for d, _, _ in pts], [p for _, p, _ in pts], marker=".",
                    label=f"preferred {pref}")
        ax.axvline(20, ls="--", color="red", lw=1)
        ax.set(title=f"{load:,} req/s", xlabel="max_queue_delay (ms)", ylabel="p99 (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("p99 against the batching window (H200 BERT-base fp16 profile)")
    fig.tight_layout()
    fig.savefig(HERE / "window_p99.png", dpi=110)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("rate_none", "rate_dynamic_0us", "rate_dynamic_1000us", "rate_dynamic_2000us"):
        table = sorted(rows(name), key=lambda r: float(r["rate_scale"]))
        offered = [float(r["rate_scale"]) * TRACE_RATE for r in table]
        ok = [r for r in table if r["meets_slo"] == "true"]
        best = max(ok, key=lambda r: float(r["rate_scale"])) if ok else None
        summary["throughput"][name] = {
            "max_rate_within_bound": float(best["rate_scale"]) * TRACE_RATE if best else None,
            "throughput_rps": float(best["throughput_rps"]) if best else None,
            "p99_ms": float(best["p99_ms"]) if best else None,
            "mean_batch": float(best["mean_batch_size"]) if best else None,
            "by_rate": [{"offered_rps": o, "throughput_rps": float(r["throughput_rps"]),
                         "p99_ms": float(r["p99_ms"]), "mean_batch": float(r["mean_batch_size"])}
                        for o, r in zip(offered, table)],
        }
        label = name.removeprefix("rate_").replace("_", " ")
        ax1.plot(offered, [float(r["p99_ms"]) for r in table], marker=".", label=label)
        ax2.plot(offered, [float(r["mean_batch_size"]) for r in table], marker=".", label=label)
    ax1.axhline(P99_BOUND_MS, ls="--", color="red", lw=1)
    ax1.set(xlabel="offered load (req/s)", ylabel="p99 (ms)", yscale="log", title="p99 against load")
    ax2.axhspan(6, 12, color="tab:green", alpha=0.15, label="mean batch 6-12")
    ax2.set(xlabel="offered load (req/s)", ylabel="mean batch (samples)", title="Mean batch against load")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "throughput.png", dpi=110)
    plt.close(fig)
    none = summary["throughput"]["rate_none"]["max_rate_within_bound"]
    for name, entry in summary["throughput"].items():
        if entry["max_rate_within_bound"] and none:
            entry["x_none"] = entry["max_rate_within_bound"] / none
        # Throughput where the dynamic batcher's mean batch is 6 to 12, against none's best.
        band = [p for p in entry["by_rate"] if 6 <= p["mean_batch"] <= 12 and p["p99_ms"] <= P99_BOUND_MS]
        entry["mean_batch_6_to_12"] = {
            "offered_rps": [band[0]["offered_rps"], band[-1]["offered_rps"]] if band else None,
            "x_none": [band[0]["throughput_rps"] / none, band[-1]["throughput_rps"] / none] if band and none else None,
        }
    summary["profile_batch_speedup"] = profile_speedups()
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "by_rate"}
                      for k, v in summary["throughput"].items()}, indent=2))


def profile_speedups() -> dict:
    """Samples/s of back-to-back batches of b against batch 1, from the profile alone
    (mean service time plus the measured dispatch overhead; no queueing, no wake-ups)."""
    from schedsim.cost.model import CostModel
    from schedsim.cost.profile import default_profile_path, load_profile

    cost = CostModel.from_profile(load_profile(default_profile_path()))
    one = 1 / cost.mean_s(1, 128)
    return {b: (b / cost.mean_s(b, 128)) / one for b in (1, 4, 6, 8, 10, 12, 16, 32, 64)}


if __name__ == "__main__":
    main() if sys.argv[1:] != ["--summarise"] else summarise()
