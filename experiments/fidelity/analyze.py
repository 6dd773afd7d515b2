"""The fidelity table's simulator half: predict every live cell of run_h200.py and compare.

For each cell in RUN/cells/ (the device's output): rebuild the live requests.csv from
result.npz, simulate the same arrivals with the same policy under several cost models and
run ``schedsim validate`` on each: (a) the committed profile
(profiles/bert-base-fp16-cg-h200.csv) with its dispatch overhead and no wake-up cost, (b) the
profile measured in the same device call (RUN/profile/samecall.csv), when there is one;
with --calibration, (c) a plus the constant wake-up measured by calibrate_h200.py and (d) c
plus the 2-instance profile for batches that share the GPU; and (e) the default: a plus
the sidecar's wake-up curve by idle time (fit_wake_curve.py) plus the 2-instance profile;
(e0) e without the two-instance profile's pair-slowdown grid (each
batch beside the other instance's priced by the equal-size table at launch, as before);
(f) e on the same-call table, when there is one; (g) e with the power cap measured on the
same GPU in the same call (RUN/gpu_load/, diagnose_gpu_load.py), when there is one.
Writes, into --results (committed): fidelity.csv (one row per cell and profile),
fidelity.png (predicted vs measured p99, and the p99 errors) and summary.json (the
issue's targets: p99 error within 3% median and 8% worst for one instance, 10% worst for
two, throughput within 1%), and prints the table as Markdown for the README.

    python experiments/fidelity/analyze.py --run RUN_DIR --results experiments/fidelity/results
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.raw_runs import require  # noqa: E402

from schedsim.cost.model import CostModel  # noqa: E402
from schedsim.core.metrics import combine_replications, summarize  # noqa: E402
from schedsim.registry import build_policy  # noqa: E402
from schedsim.core.policy import Requests  # noqa: E402
from schedsim.cost.profile import load_profile  # noqa: E402
from schedsim.run.report import write_outputs  # noqa: E402
from schedsim.core.results import SimResult  # noqa: E402
from schedsim.core.simulate import simulate  # noqa: E402
from schedsim.traces.table import Trace  # noqa: E402
from schedsim.live.validate import validate_dirs  # noqa: E402

TARGETS = {"p99_median_1inst": 3.0, "p99_worst_1inst": 8.0, "p99_worst_2inst": 10.0, "throughput_worst": 1.0}


def live_result(cell_dir: Path) -> tuple[Trace, SimResult]:
    z = np.load(cell_dir / "result.npz")
    arrival_ns = z["arrival_ns"]
    trace = Trace.from_arrivals(arrival_ns / 1e9, seq_len=np.full(arrival_ns.size, 128))
    req = Requests.from_trace(trace)
    if not np.array_equal(req.arrival_ns, arrival_ns):
        raise RuntimeError(f"{cell_dir}: arrivals do not round-trip through seconds")
    live = SimResult(req, z["start_ns"], z["end_ns"], z["batch_size"], z["instance"], z["status"],
                     z["batch_start_ns"], z["batch_end_ns"], z["batch_instance"], z["batch_samples"],
                     z["batch_requests"], int(json.loads((cell_dir / "summary.json").read_text())["config"]["instances"]), 0)
    return trace, live


def analyze_cell(cell_dir: Path, profiles: dict, replications: int) -> list[dict]:
    summary = json.loads((cell_dir / "summary.json").read_text())
    info = json.loads((cell_dir / "live.json").read_text())
    cell, cfg = info["cell"], summary["config"]
    trace, live = live_result(cell_dir)
    if not (cell_dir / "requests.csv").exists():
        write_outputs(cell_dir, live, trace.request_id, summary)  # same summary, plus requests.csv
    warmup = cfg["warmup_s"]
    rows = []
    for label, (profile, wake_s, contention) in profiles.items():
        cost = CostModel.from_profile(profile, wake_overhead_s=wake_s)
        if contention:
            cost.with_contention({k: CostModel.from_profile(p, wake_overhead_s=0.0) for k, p in contention.items()})
        sims = [simulate(Requests.from_trace(trace), build_policy(cfg["policy"], dict(cfg["params"])), cost,
                         instances=cfg["instances"], seed=1 + r) for r in range(replications)]
        sums = [summarize(s, warmup) for s in sims]
        sim_summary = sums[0] if replications == 1 else combine_replications(sums)
        sim_summary["config"] = {k: cfg[k] for k in ("policy", "params", "instances", "warmup_s")} | {
            "profile": str(profile.path), "dispatch_overhead_us": cost.dispatch_overhead_s * 1e6}
        sim_dir = cell_dir / f"sim-{label}"
        write_outputs(sim_dir, sims[0], trace.request_id, sim_summary)
        v = validate_dirs(sim_dir, cell_dir, out=cell_dir / f"validate-{label}", plot=False)
        m = v["metrics"]
        lv = summary["live"]
        rows.append({
            "cell": cell["name"], "profile": label, "policy": cfg["policy"], "params": json.dumps(cfg["params"]),
            "instances": cfg["instances"], "arrival": cell["arrival"], "load": cell["load"],
            "rate_rps": info["rate_rps"], "requests": summary["requests"], "spin_us": cell["spin_us"],
            **{f"{k}_{side}": m[k][side] for k in ("p50", "p99", "mean", "throughput", "mean_batch_size")
               for side in ("predicted", "measured")},
            **{f"{k}_err_pct": v[f"{k}_err_pct"] for k in ("p50", "p90", "p99", "p999", "mean", "throughput",
                                                           "mean_batch_size")},
            "p99_in_ci": m["p99"].get("measured_in_ci"), "ks_stat": v["ks_stat"],
            "late_p99_us": lv["issue_lateness_us"].get("p99"), "timer_late_p99_us": lv["timer_lateness_us"].get("p99"),
            "dispatch_mean_us": lv["dispatch_us"].get("mean"), "completion_gap_mean_us": lv["completion_gap_us"].get("mean"),
            "engine_host_ms_mean": lv["engine_host_ms"].get("mean"), "engine_gpu_ms_mean": lv["engine_gpu_ms"].get("mean"),
            "model_dispatch_us": cost.dispatch_overhead_s * 1e6,
            "model_wake_us": cost.wake_overhead_s * 1e6,
        })
    return rows


def verdict(table: pd.DataFrame) -> dict:
    out = {}
    for label, t in table.groupby("profile"):
        one, two = t[t.instances == 1], t[t.instances == 2]
        got = {
            "p99_median_1inst": float(one.p99_err_pct.abs().median()) if len(one) else None,
            "p99_worst_1inst": float(one.p99_err_pct.abs().max()) if len(one) else None,
            "p99_worst_2inst": float(two.p99_err_pct.abs().max()) if len(two) else None,
            "throughput_worst": float(t.throughput_err_pct.abs().max()),
        }
        out[label] = {"achieved": got, "targets": TARGETS,
                      "met": {k: (v is not None and v <= TARGETS[k]) for k, v in got.items()},
                      "worst_cells_p99": t.reindex(t.p99_err_pct.abs().sort_values(ascending=False).index)
                      [["cell", "p99_err_pct"]].head(5).to_dict("records")}
    return out


def plot(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    for label, t in table.groupby("profile"):
        a.scatter(t.p99_measured, t.p99_predicted, s=14, label=f"profile {label}")
    lim = [table[["p99_measured", "p99_predicted"]].min().min() * 0.8, table[["p99_measured", "p99_predicted"]].max().max() * 1.2]
    a.plot(lim, lim, color="grey", lw=0.8)
    a.set(xscale="log", yscale="log", xlabel="measured p99 (ms)", ylabel="predicted p99 (ms)",
          title="p99 latency, every cell")
    a.legend()
    t = table[table.profile == table.profile.iloc[0]]
    order = np.arange(len(t))
    for label, tt in table.groupby("profile"):
        labels = sorted(table.profile.unique())
        width = 0.8 / len(labels)
        b.barh(order + (labels.index(label) - (len(labels) - 1) / 2) * width, tt.p99_err_pct.to_numpy(),
               height=width, label=f"model {label}")
    b.set_yticks(order, t.cell, fontsize=6)
    for x in (-8, -3, 3, 8):
        b.axvline(x, color="grey", ls=":", lw=0.8)
    b.set(xlabel="p99 error, % of measured", title="p99 error per cell")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def wake_overhead_s(calib_dir: Path, profile) -> float:
    """The extra cost of a launch that wakes an idle serving loop, from the calibration run
    alone (calibrate_h200.py's light-load loops, never a validation cell): the mean of
    (completion - the arrival that triggered it) - (the profile's mean latency for that batch
    + its dispatch overhead) over the arrival-triggered launches."""
    mean_ms = dict(zip(profile.table["batch"], profile.table["latency_ms_mean"]))
    dispatch_s = float(profile.meta.get("dispatch_overhead_us", 0.0)) * 1e-6
    extra = []
    for name in ("none_light", "dynamic_light"):
        b = pd.read_csv(calib_dir / f"loop_{name}.csv")
        b = b[(b.trigger == "arrival") & (b.status == "ok")]
        extra.append((b.done_s - b.trigger_s) - b.samples.map(mean_ms) / 1e3 - dispatch_s)
    return float(pd.concat(extra).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="the device's output directory (holds cells/)")
    ap.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--replications", type=int, default=5)
    ap.add_argument("--calibration", type=Path, help="calibrate_h200.py's output: adds model c, the "
                    "committed profile plus the measured wake overhead, and model d, c plus the "
                    "2-instance profile for batches that share the GPU")
    args = ap.parse_args(argv)
    require(args.run, *([args.calibration] if args.calibration else []))
    committed = load_profile(ROOT / "profiles" / "bert-base-fp16-cg-h200.csv")
    # a and b: the tables and their dispatch overhead alone (no wake-up term)
    profiles = {"a": (committed, 0.0, None)}
    same = args.run / "profile" / "samecall.csv"
    if same.exists():
        profiles["b"] = (load_profile(same), 0.0, None)
    if args.calibration:
        wake = wake_overhead_s(args.calibration, committed)
        print(f"wake overhead from the calibration: {wake * 1e6:.1f} us", flush=True)
        profiles["c"] = (committed, wake, None)
        # d: c, and batches sharing the GPU priced by the profile measured with 2 instances
        duo = load_profile(ROOT / "profiles" / "bert-base-fp16-cg-2inst-h200.csv")
        profiles["d"] = (committed, wake, {2: duo})
    # e (the default now): the sidecar's wake curve (extra by idle time, fit_wake_curve.py over
    # calibration loops only) and the 2-instance profile for batches that share the GPU
    if "wake_curve" in committed.meta:
        duo = load_profile(ROOT / "profiles" / "bert-base-fp16-cg-2inst-h200.csv")
        profiles["e"] = (committed, None, {2: duo})
        if "pair_slowdown" in duo.meta:
            # e0: e as it was before the pair grid: a batch launched beside the other instance's
            # priced by the equal-size two-instance table, at launch (schedsim.core.contention)
            flat = dataclasses.replace(duo, meta={k: v for k, v in duo.meta.items() if k != "pair_slowdown"})
            profiles["e0"] = (committed, None, {2: flat})
        if "b" in profiles:
            # f: e with the table measured on this machine just before the cells; the dispatch
            # overhead, wake curve and 2-instance profile stay the committed (calibrated) ones
            fresh = profiles["b"][0]
            for key in ("wake_curve", "dispatch_overhead_us", "dispatch_overhead_us_per_sample"):
                if key in committed.meta:
                    fresh.meta[key] = committed.meta[key]
            profiles["f"] = (fresh, None, {2: duo})
        batches = next((p for p in (args.run / "gpu_load" / f"batches.csv{z}" for z in (".gz", ""))
                        if p.exists()), None)
        if batches is not None:
            # g: e with the power cap measured on this machine's GPU in the same call, apart from
            # the cells (diagnose_gpu_load.py, fitted by fit_power_cap.py): GPUs differ in it.
            from experiments.fidelity.fit_power_cap import fit as fit_power_cap

            own = dataclasses.replace(committed, meta=dict(committed.meta, power_cap=fit_power_cap(pd.read_csv(batches))))
            print(f"model g: this GPU's power cap {own.meta['power_cap']['factor']}", flush=True)
            profiles["g"] = (own, None, {2: duo})
    rows = []
    for cell_dir in sorted((args.run / "cells").iterdir()):
        if (cell_dir / "summary.json").exists():
            rows += analyze_cell(cell_dir, profiles, args.replications)
            print(f"analyzed {cell_dir.name}", flush=True)
    table = pd.DataFrame(rows)
    args.results.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.results / "fidelity.csv", index=False, float_format="%.5g")
    plot(table, args.results / "fidelity.png")
    summary = {"cells": int(table.cell.nunique()), "verdict": verdict(table)}
    info = args.run / "run_info.json"
    if info.exists():
        summary["run_info"] = json.loads(info.read_text())
    (args.results / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    cols = ["cell", "profile", "p50_err_pct", "p99_err_pct", "mean_err_pct", "throughput_err_pct", "ks_stat",
            "late_p99_us", "completion_gap_mean_us"]
    print(table[cols].to_markdown(index=False, floatfmt=".2f") if _has_tabulate() else table[cols].to_string())
    print(json.dumps(summary["verdict"], indent=2))
    return 0


def _has_tabulate() -> bool:
    import importlib.util

    return importlib.util.find_spec("tabulate") is not None


if __name__ == "__main__":
    sys.exit(main())
