"""The LLM fidelity table: predicted (the simulator, here) against measured (run_h200.py).

    python experiments/fidelity-llm/analyze.py --prepare            # cell traces -> traces/*.npz
    python experiments/fidelity-llm/analyze.py --run PATH/fidelity-llm   # after the device run

``--prepare`` cuts each cell's slice from ../shared/traces and writes traces/NAME.npz (the
device reads those: it has no pyarrow). The analysis writes, per cell,
results/cells/NAME/{live,sim}/ (requests.csv, steps.csv, summary.json: what ``schedsim live``
and ``schedsim run`` write) and validation.json + llm_cdf_validation.png (``schedsim
validate``), then results/fidelity_llm.csv (one row per cell), results/fidelity_llm.png and
results/summary.json, and prints the table. ``--sim-only`` prints the predictions alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import HERE, engine_settings, load_cell_trace, load_cells, load_result, smoke  # noqa: E402
from experiments.raw_runs import require  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
PROFILE = ROOT / "profiles" / "llama-1b-bf16-h200-steps.csv"
TABLE = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99", "throughput", "preemptions")


def prepare(cells_mod) -> None:
    from schedsim.traces.io import load_trace

    (HERE / "traces").mkdir(exist_ok=True)
    loaded = {}
    for cell in cells_mod.CELLS:
        name = cell["trace"]
        if name not in loaded:
            loaded[name] = load_trace(SHARED / name)
        t = loaded[name]
        lo = int(np.searchsorted(t.arrival_s, cells_mod.WINDOW_S[name]))
        s = t.slice(lo, lo + cell["requests"])
        arr = s.arrival_s - s.arrival_s[0]
        native = (len(s) - 1) / arr[-1]
        arr = arr * native / cell["rate_rps"]
        cols = {"arrival_s": arr, "input_tokens": s.input_tokens, "output_tokens": s.output_tokens,
                "request_id": s.request_id}
        if s.hash_ids is not None:
            cols |= {"hash_offsets": s.hash_offsets, "hash_ids": s.hash_ids,
                     "hash_block_tokens": np.int64(s.meta.get("hash_block_tokens", 512))}
        np.savez_compressed(HERE / "traces" / f"{cell['name']}.npz", **cols)
        print(f"{cell['name']:<24} {len(s):4d} requests, native {native:.2f} req/s -> {cell['rate_rps']} req/s, "
              f"{arr[-1]:.1f} s of arrivals, prompts mean {s.input_tokens.mean():.0f} max {s.input_tokens.max()}")


def config(cell: dict, driver: str) -> dict:
    return {"trace": f"traces/{cell['name']}.npz", "policy": cell["policy"], "params": cell["params"],
            "instances": 1, "warmup_s": 0.0, "rate_scale": 1.0, "driver": driver}


def cell_trace(cell, is_smoke: bool):
    trace = load_cell_trace(HERE / "traces" / f"{cell['name']}.npz")
    return smoke(cell, trace) if is_smoke else (cell, trace)


def engine_model(cells_mod, is_smoke: bool = False, run: Path | None = None):
    """The step cost model of the cells' one live engine, with the token counts its warm-up
    runs (run_h200.py: one warm_up for all cells) as its warm ones: the warm-up ``run``
    recorded (runs 1-12 had no dense sweep of short prefills), today's without one."""
    from schedsim.cost.step_model import StepCostModel
    from schedsim.cost.step_profile import load_step_profile
    from schedsim.live.llm_warmup import warm_token_counts
    from schedsim.registry import build_policy
    from schedsim.core.policy import Requests

    profile = load_step_profile(PROFILE)
    cost = StepCostModel.from_profile(profile)
    if cost.first_call_ns:
        runs = []
        for cell in cells_mod.CELLS:
            cell, trace = cell_trace(cell, is_smoke)
            runs.append((Requests.from_trace(trace), build_policy(cells_mod.policy_name(cell), dict(cell["params"]))))
        info = run / "run_info.json" if run is not None else None
        dense = (json.loads(info.read_text()).get("setup", {}).get("warmup_dense_steps", 0) > 0
                 if info is not None and info.exists() else True)
        cost.warm_tokens = warm_token_counts(block_size=16, graph_batch_sizes=profile.cuda_graph_batch_sizes,
                                             dense=dense, **engine_settings(runs))
    return cost


def simulate(cell, cells_mod, out_dir: Path | None, is_smoke: bool = False, cost=None) -> dict:
    """Predict one cell. ``cost``: the engine's model (:func:`engine_model`), shared by the
    cells in the order they ran live: each starts with the token counts the ones before ran."""
    from schedsim.core.llm_metrics import summarize_llm
    from schedsim.run.llm_report import write_llm_outputs
    from schedsim.core.llm_simulate import simulate_llm
    from schedsim.registry import build_policy
    from schedsim.core.policy import Requests

    cell, trace = cell_trace(cell, is_smoke)
    requests = Requests.from_trace(trace)
    policy = build_policy(cells_mod.policy_name(cell), dict(cell["params"]))
    cost = cost or engine_model(cells_mod, is_smoke)
    cost.bytes_per_block = policy.budget.block_size * policy.budget.spec.kv_bytes_per_token
    result = simulate_llm(requests, policy, cost, seed=1)
    cost.warm_tokens = frozenset(cost.seen_tokens)   # the next cell's engine has run these
    summary = summarize_llm(result)
    summary["config"] = config(cell, "simulate") | {"profile": str(PROFILE), "replications": 1}
    if out_dir is not None:
        write_llm_outputs(out_dir, result, trace.request_id, summary)
    return summary


def write_live(cell, run_dir: Path, out_dir: Path, is_smoke: bool = False) -> dict:
    from schedsim.run.llm_report import write_llm_outputs
    from schedsim.core.policy import Requests

    cell, trace = cell_trace(cell, is_smoke)
    cell_dir = run_dir / "cells" / cell["name"]
    result = load_result(cell_dir, Requests.from_trace(trace))
    summary = json.loads((cell_dir / "summary.json").read_text())
    summary["config"] = config(cell, "live") | {"backend": "torch-llm", "model": "builtin:llama-1b",
                                                 "device": "cuda", "precision": "bf16"}
    write_llm_outputs(out_dir, result, trace.request_id[:len(result.requests)], summary)
    return summary


STEP_COLUMNS = ("n_rows", "tokens", "prefill_rows", "prefill_attention", "prefill_context", "decode_rows",
                "decode_max_context", "graph", "gpu_ms")


def priced_steps(steps_csv: Path, cost=None) -> dict | None:
    """Every logged ok step of a live_steps.csv, priced by the step model: arrays ``graph``
    (bool), ``tokens``, ``pred``, ``meas`` (ms), ``err`` (%), ``start_s``, ``gpu_ms`` in log
    order, and ``with_host``, ``kv_from``; None for a log without composition columns (run1).

    The step model's features (schedsim.cost.step_model.step_features) are computed from each
    logged step's composition sums with cost.py's formulas: a graph step runs at G =
    graph_batch(n_rows) and W = context_blocks(decode_max_context + 1) blocks; an eager step
    from tokens, prefill rows, prefill attention pairs, prefill context and decode rows with
    D = round_up(decode_max_context + 1, block_size). Predicted ms = features . fitted
    coefficients + the profile's step overhead; measured = the CUDA-event time, or the engine
    call's wall time (engine_ms) when the fit includes the host time per composition.
    """
    import csv

    from schedsim.cost.step_fit import KV_FEATURE, gpu_bound_serial_keys, real_kv_tokens, serial_keys, step_features
    from schedsim.cost.step_model import StepCostModel
    from schedsim.cost.step_profile import load_step_profile
    from schedsim.cost.llm_shapes import context_blocks_array, graph_batch_array

    steps_csv = Path(steps_csv)
    if not steps_csv.exists() and steps_csv.with_name(steps_csv.name + ".gz").exists():
        steps_csv = steps_csv.with_name(steps_csv.name + ".gz")   # committed runs keep their logs gzipped
    opener = gzip.open if steps_csv.suffix == ".gz" else open
    with opener(steps_csv, "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not set(STEP_COLUMNS) <= set(rows[0]):
        return None
    rows = [r for r in rows if r.get("status", "ok") == "ok" and r["gpu_ms"] not in ("", "nan")]
    cost = cost or StepCostModel.from_profile(load_step_profile(PROFILE))
    col = {k: np.array([float(r[k]) if k == "gpu_ms" else int(r[k]) for r in rows] if k != "graph"
                       else [r[k] == "True" for r in rows]) for k in STEP_COLUMNS}
    if not rows:
        return None
    bs = cost.block_size
    graph = col["graph"].astype(np.int64)
    sizes = cost.graph_sizes or (1,)
    top = col["decode_max_context"] + 1
    padded = np.where(graph == 1, graph_batch_array(col["n_rows"], sizes), 0)
    width = np.where(graph == 1, context_blocks_array(np.maximum(top, 1), bs) * bs, 0)
    dwidth = np.where(col["decode_rows"] > 0, -(-top // bs) * bs, 0)
    real_kv, kv_from = None, None
    if cost.fit.features[-1] == KV_FEATURE:
        # The decode rows' KV tokens summed; a log without that column (runs 1-4) gives every
        # decode row the longest one's context, an upper bound.
        if "decode_kv_tokens" in rows[0]:
            kv, kv_from = np.array([int(r["decode_kv_tokens"]) for r in rows]), "decode_kv_tokens"
        else:
            kv, kv_from = col["decode_rows"] * top, "decode_rows x (decode_max_context + 1), an upper bound"
        real_kv = real_kv_tokens(col["decode_rows"], kv, bs)
    # The eager decode attention's serial keys, where the model has them (schedsim.cost.step_model).
    serial = None if cost._attention is None else serial_keys(col["decode_rows"], dwidth, cost._attention, bs)
    bound = None if not cost._gpu_bound else gpu_bound_serial_keys(
        np.where(graph == 1, 0, col["tokens"]), col["decode_rows"], dwidth, cost._attention, bs)
    feats = step_features(graph, padded, width, col["tokens"], col["prefill_rows"], col["prefill_attention"],
                          col["prefill_context"], col["decode_rows"], dwidth, real_kv, serial, bound)
    pred = sum(c * np.asarray(f, np.float64) for c, f in zip(cost._coef, feats)) + cost.overhead_ns / 1e6
    # A fit with the host time per composition prices the whole engine call (host and GPU),
    # what engine_ms times live; else the forward pass, against its CUDA-event time.
    with_host = cost.fit.includes_host and "engine_ms" in rows[0]
    meas = np.array([float(r["engine_ms"]) for r in rows]) if with_host else col["gpu_ms"]
    return {"graph": graph == 1, "tokens": col["tokens"], "pred": pred, "meas": meas,
            "err": (pred - meas) / meas * 100.0, "start_s": np.array([float(r["start_s"]) for r in rows]),
            "gpu_ms": col["gpu_ms"], "with_host": with_host, "kv_from": kv_from}


def step_errors(steps_csv: Path, cost=None) -> dict:
    """Per-step predicted vs measured time of a live_steps.csv (:func:`priced_steps`), graph
    and eager steps apart: {graph,eager}_{n, err_p50_pct, err_p90_pct} of (predicted -
    measured) / measured, {graph,eager}_live_host_us_p50 (the median of the live step period
    minus its GPU time) and model_step_overhead_us; {} for a log without composition columns
    (run1) and NaN where a kind has no step."""
    from schedsim.cost.step_model import StepCostModel
    from schedsim.cost.step_profile import load_step_profile

    cost = cost or StepCostModel.from_profile(load_step_profile(PROFILE))
    p = priced_steps(steps_csv, cost)
    if p is None:
        return {}
    err, meas = p["err"], p["meas"]
    # Host time per step in the live loop: the next step's start minus this one's start,
    # less this step's GPU time (scheduling, input packing, launch, synchronize).
    host_us = (np.append(np.diff(p["start_s"]), np.nan) * 1e3 - p["gpu_ms"]) * 1e3
    out = {"model_step_overhead_us": cost.overhead_ns / 1e3,
           "step_err_against": "engine_ms" if p["with_host"] else "gpu_ms"}
    if p["kv_from"]:
        out["step_real_kv_from"] = p["kv_from"]
    for kind, mask in (("graph", p["graph"]), ("eager", ~p["graph"])):
        e = err[mask & np.isfinite(err) & (meas > 0)]
        h = host_us[mask & np.isfinite(host_us)]
        out[f"step_{kind}_n"] = int(e.size)
        out[f"step_{kind}_err_p50_pct"] = float(np.median(e)) if e.size else math.nan
        out[f"step_{kind}_err_p90_pct"] = float(np.percentile(e, 90)) if e.size else math.nan
        out[f"step_{kind}_live_host_us_p50"] = float(np.median(h)) if h.size else math.nan
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepare", action="store_true", help="cut the cell traces into traces/*.npz")
    ap.add_argument("--run", type=Path, help="run_h200.py's --out directory, fetched from the device")
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--sim-only", action="store_true", help="print the predictions only")
    ap.add_argument("--smoke", action="store_true", help="analyze run_h200.py --smoke's CPU output")
    ap.add_argument("--profile", type=Path, help="the step profile to predict with (default: the committed one)")
    args = ap.parse_args(argv)
    if args.run is not None:
        require(args.run)
    global PROFILE
    PROFILE = args.profile.resolve() if args.profile else PROFILE
    cells_mod = load_cells()
    if args.prepare:
        prepare(cells_mod)
        return 0
    cost = engine_model(cells_mod, args.smoke, args.run)
    if args.sim_only or args.run is None:
        for cell in cells_mod.CELLS:
            s = simulate(cell, cells_mod, None, cost=cost)
            print(f"{cell['name']:<24} TTFT p50 {s['ttft_p50_ms']:8.1f} p99 {s['ttft_p99_ms']:8.1f}  TPOT p50 "
                  f"{s['tpot_p50_ms']:6.2f} p99 {s['tpot_p99_ms']:6.2f}  E2E p50 {s['e2e_p50_ms']:7.0f} p99 "
                  f"{s['e2e_p99_ms']:7.0f}  pre {s['preemptions']:4d}  busy until {s['duration_s']:.1f} s")
        return 0

    from schedsim.files import write_json
    from schedsim.live.llm_validate import validate_llm_dirs

    rows = []
    for cell in cells_mod.CELLS:
        if not (args.run / "cells" / cell["name"] / "summary.json").exists():
            print(f"{cell['name']}: not measured (skipped on the device)")
            continue
        base = args.results / "cells" / cell["name"]
        live = write_live(cell, args.run, base / "live", args.smoke)
        simulate(cell, cells_mod, base / "sim", args.smoke, cost=cost)
        report = validate_llm_dirs(base / "sim", base / "live", out=base, plot=True)
        row = {"cell": cell["name"], "policy": cell["policy"], "rate_rps": cell["rate_rps"],
               "requests": report["trace_requests"], "partial": bool(live.get("partial"))}
        for key in TABLE:
            m = report["metrics"][key]
            row[f"{key}_pred"], row[f"{key}_meas"], row[f"{key}_err_pct"] = m["predicted"], m["measured"], m["err_pct"]
        for k in ("ttft", "tpot", "e2e"):
            row[f"ks_{k}"] = report["ks"][k]["stat"]
        lv = live.get("live", {})
        row["engine_gpu_ms_mean"] = lv.get("engine_gpu_ms", {}).get("mean")
        row["step_host_ms_mean"] = lv.get("step_host_ms", {}).get("mean")
        steps = step_errors(args.run / "cells" / cell["name"] / "live_steps.csv")
        for kind in ("graph", "eager"):
            for k in ("n", "err_p50_pct", "err_p90_pct", "live_host_us_p50"):
                row[f"step_{kind}_{k}"] = steps.get(f"step_{kind}_{k}", math.nan if k != "n" else 0)
        row["model_step_overhead_us"] = steps.get("model_step_overhead_us", math.nan)
        row["targets_met"] = report["targets_met"]
        rows.append(row)
    if not rows:
        print("no measured cells")
        return 1
    args.results.mkdir(parents=True, exist_ok=True)
    import csv

    with open(args.results / "fidelity_llm.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    _plot(rows, args.results / "fidelity_llm.png")
    lat = [abs(r[f"{k}_err_pct"]) for r in rows for k in TABLE[:6] if math.isfinite(r[f"{k}_err_pct"])]
    summary = {"cells": len(rows), "targets_met_cells": sum(r["targets_met"] for r in rows),
               "latency_abs_err_pct_median": float(np.median(lat)) if lat else None,
               "latency_abs_err_pct_worst": float(np.max(lat)) if lat else None,
               "profile": str(PROFILE.relative_to(ROOT)) if PROFILE.is_relative_to(ROOT) else str(PROFILE),
               "run": str(args.run)}
    write_json(args.results / "summary.json", summary)
    print(f"{'cell':<24}" + "".join(f"{k:>18}" for k in TABLE))
    for r in rows:
        print(f"{r['cell']:<24}" + "".join(f"{_fmt(r, k):>18}" for k in TABLE))
    print(json.dumps(summary, indent=2))
    print("\n| cell | " + " | ".join(TABLE) + " | step err graph p50 / p90 | step err eager p50 / p90 "
          "| live host us/step, graph / eager (model) |")
    print("| --- |" + " --- |" * (len(TABLE) + 3))
    for r in rows:
        cells = [f"{_num(r[f'{k}_pred'])} / {_num(r[f'{k}_meas'])} ({_pct(r[f'{k}_err_pct'])})" for k in TABLE]
        cells += [f"{_pct(r[f'step_{kind}_err_p50_pct'])} / {_pct(r[f'step_{kind}_err_p90_pct'])} "
                  f"(n={r[f'step_{kind}_n']})" if r.get(f"step_{kind}_n") else "-" for kind in ("graph", "eager")]
        cells.append(f"{_num(r.get('step_graph_live_host_us_p50'))} / {_num(r.get('step_eager_live_host_us_p50'))} "
                     f"({_num(r.get('model_step_overhead_us'))})")
        print(f"| {r['cell']} | " + " | ".join(cells) + " |")
    return 0


def _num(v) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4g}"


def _pct(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:+.0f}%"


def _fmt(r, k) -> str:
    e = r[f"{k}_err_pct"]
    m = r[f"{k}_meas"]
    return f"{m:.4g} ({e:+.1f}%)" if m is not None and math.isfinite(e) else f"{m} (-)"


def _plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = TABLE[:6]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(keys)
    x = np.arange(len(rows))
    for i, k in enumerate(keys):
        ax.bar(x + i * width, [r[f"{k}_err_pct"] for r in rows], width, label=k)
    ax.axhspan(-5, 5, color="green", alpha=0.1, label="target ±5%")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x + 0.4 - width / 2)
    ax.set_xticklabels([r["cell"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("predicted - measured (% of measured)")
    ax.set_title("LLM fidelity: llama-1b bf16 on one H200, simulator vs live engine")
    ax.legend(fontsize=7, ncol=4)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
