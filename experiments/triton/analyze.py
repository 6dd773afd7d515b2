"""The Triton fidelity table: each live cell of ``run_h200.py`` against ``schedsim run``.

For every cell the trace is regenerated from its recorded seed, rate and duration (the
same generator ``run_h200.py`` used) and simulated with the cost table measured through
the same Triton server (``schedsim profile --backend triton``), with the cell's policy
settings and warm-up, ``--replications`` seeds of service-time draws. The live figure is
the median of the cell's replications (fresh servers), shown with its range.

Compared:
- server-side mean latency: Triton's own statistics (``success`` time per request: queue
  plus compute, from the server receiving the request to its response) against the
  simulator's mean latency;
- client-side p50/p99 (latency from each request's scheduled time to its answer) against
  the simulator's percentiles plus the request path the profiler measured
  (``triton_terms.request_path_us``: the client's latency beyond Triton's own request time);
- server-side p50/p99 per request against the simulator's percentiles: from the model's
  execution log when the run has one (each request's send to the end of its execution),
  else from Triton's trace where the grid traced requests (``triton_server_side_*.jsonl``:
  REQUEST_START -> REQUEST_END of one request in N, after the warm-up);
- throughput;
- where the simulator reports a band (``p99_ms_lo``/``p99_ms_hi``, ``mean_ms_lo``/``mean_ms_hi``),
  whether the live median and each live run's server-side p99 and mean fall inside it.
  ``--host-record`` predicts with another ``host_variation`` record in place of the
  profile's (``server_record.py``: servers measured on other machines);
  ``--hold-out-servers SPEEDS`` gives each run its own band, from a record of the *other*
  servers of the same machine (``server_speed.py``'s rows): what a between-server record
  measured on the serving machine (``--triton-host-servers``) would do, the run's own
  server left out.

    python experiments/triton/analyze.py --profile P.csv --grid G1.jsonl [G2.jsonl ...] \
        --tag h200 --out results/

(each grid file's ``triton_server_side_*.jsonl`` beside it is read when present).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from schedsim.run.runner import execute  # noqa: E402
from schedsim.run.spec import RunSpec  # noqa: E402
from schedsim.traces.generate import generate  # noqa: E402
from schedsim.traces.io import save_trace  # noqa: E402
from schedsim.traces.table import Trace  # noqa: E402
from schedsim.triton.repository import triton_prefetches  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_record import server_factors, server_record  # noqa: E402

SEQ_LEN = 128


WARMUP_S = 0.5  # run_h200.py's warm-up: neither side counts requests scheduled before it
BORROWED_TERMS = ("wake_curve", "dispatch_overhead_us", "dispatch_overhead_us_per_sample", "dispatch_overhead")
"""What ``--borrow-terms`` takes from another profile's sidecar: the idle batcher's wake-up and
the busy server's time per batch outside compute."""


def simulate_cell(run: dict, profile: Path, replications: int, work: Path, received: Path | None = None,
                  extrapolate: bool = False) -> dict:
    """``schedsim run`` of the cell's trace (``extrapolate``: sizes past the table's largest from
    its last two); with ``received`` (the run's ``--keep-requests`` npz),
    each request arrives when the client sent it (its scheduled time plus the client's lateness):
    the arrivals the server received, rather than the trace's."""
    trace = generate("gamma" if run["arrival"] != "poisson" else "poisson", rng=np.random.default_rng(run["seed"]),
                     duration_s=run["duration_s"], rate=run["rate_rps"],
                     cv=None if run["arrival"] == "poisson" else run["cv"], seq_len=f"fixed:{run.get('seq_len', SEQ_LEN)}")
    assert len(trace) == run["requests_in_trace"], (run["config"], len(trace), run["requests_in_trace"])
    name = f"{run['config']}-{run['arrival']}-{run['load']}"
    if received is not None:
        rec = np.load(received)
        late = rec["sent_s"] - rec["scheduled_s"]  # NaN where a request was never sent
        n = min(len(late), len(trace))
        shifted = trace.arrival_s.copy()
        shifted[:n] += np.where(np.isfinite(late[:n]), late[:n], 0.0)
        order = np.argsort(shifted, kind="stable")
        trace = Trace.from_arrivals(shifted[order], seq_len=trace.seq_len[order], request_id=trace.request_id[order])
        name += f"-rep{run['rep']}-sent"
    path = work / f"{name}.csv"
    save_trace(trace, path)
    params = dict(run["params"])
    if run["policy"] == "dynamic":  # Triton forms batches ahead under these settings: so does the simulator
        params.setdefault("prefetch", triton_prefetches(params))
    spec = RunSpec(trace=path, policy=run["policy"], params=params, profile=profile,
                   instances=run["instances"], warmup_s=WARMUP_S, replications=replications, seed=1,
                   extrapolate=extrapolate)
    return execute(spec).summary


def with_host_record(profile: Path, meta: dict, record: dict | None, work: Path, drop=()) -> Path:
    """A copy of ``profile`` in ``work`` whose sidecar has ``record`` as its host_variation
    (kept when None) and lacks the terms in ``drop``."""
    import shutil

    work.mkdir(parents=True, exist_ok=True)
    out = work / profile.name
    for suffix in (".csv", ".samples.npz"):
        if profile.with_suffix(suffix).is_file():
            shutil.copy(profile.with_suffix(suffix), out.with_suffix(suffix))
    new_meta = {k: v for k, v in meta.items() if k not in drop}
    if record is not None:
        new_meta["host_variation"] = record
    out.with_suffix(".json").write_text(json.dumps(new_meta))
    return out


def held_out_bands(args, runs: list[dict], meta: dict, factors, work: Path) -> list[dict]:
    """Per run, the band from a record of the other servers on its machine (its own left out)."""
    out = []
    for r in runs:
        grid = next(g for g in factors.index.get_level_values(0).unique()
                    if (g, r["config"], r["rep"]) in factors.index)
        others = factors[(factors.index.get_level_values(0) == grid)
                         & ~((factors.index.get_level_values(1) == r["config"])
                             & (factors.index.get_level_values(2) == r["rep"]))]
        prof = with_host_record(args.profile, meta, server_record(others), work / f"{r['config']}-rep{r['rep']}")
        out.append(simulate_cell(r, prof, args.replications, work, extrapolate=args.extrapolate))
    return out


def requests_file(args, run: dict) -> Path:
    path = args.requests / f"{run['config']}-{run['arrival']}-{run['load']:g}-rep{run['rep']}.npz"
    if not path.is_file():
        raise SystemExit(f"{path}: no per-request times for this run (was the grid run with --keep-requests?)")
    return path


def response_ready(received: Path, delta: dict, warmup_s: float) -> dict:
    """Per request, send -> execute end (the model's execution log) plus the mean
    compute_output of its batch's size in the run's own statistics: the execution log ends
    when ``execute`` returns, before Triton gathers the responses (compute_output, about half
    a Python-backend batch), which the simulator's batch cost includes. p50/p99 in ms of the
    requests scheduled after the warm-up."""
    rec = np.load(received)
    out_ms = {int(b): st["compute_output"]["ns"] / st["compute_output"]["count"] / 1e6
              for b, st in delta["batch_stats"].items() if st.get("compute_output", {}).get("count")}
    size = rec["model_batch_requests"]
    extra = np.array([out_ms.get(int(b), np.nan) for b in size])
    ms = (rec["model_end_s"] - rec["sent_s"]) * 1e3 + extra
    ms = ms[(rec["scheduled_s"] >= warmup_s) & np.isfinite(ms)]
    return {"n": int(ms.size), "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean())} if ms.size else {}


def server_mean_ms(delta: dict) -> float:
    s = delta["inference_stats"]["success"]
    return s["ns"] / s["count"] / 1e6 if s["count"] else math.nan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--grid", type=Path, nargs="+", required=True)
    ap.add_argument("--tag", default="h200", help="results are written as fidelity_TAG.csv and its summary")
    ap.add_argument("--replications", type=int, default=5)
    ap.add_argument("--without", nargs="*", default=[],
                    help="sidecar terms to drop before predicting (e.g. wake_curve): what each term is worth")
    ap.add_argument("--min-runs", type=int, default=3, help="cells with fewer live runs are listed, not summarised")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "triton" / "results")
    ap.add_argument("--arrivals", choices=("trace", "sent"), default="trace",
                    help="simulate the seeded trace (default) or each run's arrivals as its client sent them")
    ap.add_argument("--requests", type=Path, help="folder of the runs' per-request npz files (run_h200.py "
                                                  "--keep-requests): server-side percentiles from every request "
                                                  "with its batch's response phase, and --arrivals sent")
    ap.add_argument("--host-record", type=Path,
                    help="a JSON file with a host_variation record (server_record.py) that replaces the profile's")
    ap.add_argument("--borrow-terms", type=Path,
                    help="another profile's sidecar (.json): predict with its wake curve and dispatch terms, for "
                         "a table measured without them (a diagnostic)")
    ap.add_argument("--hold-out-servers", type=Path, nargs="+",
                    help="server_speed.py --out files: each run's band from a record of the other servers of "
                         "its machine")
    ap.add_argument("--extrapolate", action="store_true",
                    help="let batch sizes past the table's largest take its last two sizes' line")
    args = ap.parse_args(argv)
    if args.arrivals == "sent" and args.requests is None:
        ap.error("--arrivals sent needs --requests (the grid's per-request times, run_h200.py --keep-requests)")
    missing = [str(g) for g in args.grid if not g.is_file()]
    if missing:
        raise SystemExit(f"{missing[0]}: not in the working tree; experiments/RUNS.md gives the commit that holds "
                         "it (git checkout COMMIT -- PATH)")
    meta = json.loads(args.profile.with_suffix(".json").read_text())
    if args.borrow_terms:
        donor = json.loads(args.borrow_terms.read_text())
        meta = meta | {k: donor[k] for k in BORROWED_TERMS if k in donor}
    if args.without or args.host_record or args.borrow_terms:
        record = json.loads(args.host_record.read_text())["host_variation"] if args.host_record else None
        args.profile = with_host_record(args.profile, meta, record,
                                        Path(tempfile.mkdtemp(prefix="triton-ablation-")), drop=args.without)
        meta = json.loads(args.profile.with_suffix(".json").read_text())
    factors = server_factors(args.hold_out_servers) if args.hold_out_servers else None
    # A table measured without the zero-delay requests has no request path: client figures then read NaN.
    path_ms = (meta.get("triton_terms") or {}).get("request_path_us", math.nan) / 1e3
    cells = defaultdict(list)
    for g in args.grid:
        side = {}
        for s in g.parent.glob(g.name.replace("triton_grid_", "triton_server_side_")):
            for line in s.read_text().splitlines():
                r = json.loads(line)
                side[(r["config"], r["arrival"], r["load"], r["rep"])] = r
        for line in g.read_text().splitlines():
            run = json.loads(line)
            # The model's execution log when the run has one (send -> execute end, every request);
            # else Triton's trace beside the grid (REQUEST_START -> REQUEST_END, one request in N).
            run["server_side"] = run.get("server_side") or side.get((run["config"], run["arrival"], run["load"],
                                                                     run["rep"]))
            # The rate is part of the cell: each run of run_h200.py measures the capacity afresh.
            cells[(run["config"], run["arrival"], run["load"], round(run["rate_rps"], 1))].append(run)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for (config, arrival, load, _), runs in sorted(cells.items()):
            if args.arrivals == "sent":  # each run replayed on its own arrivals; the prediction is their median
                sims = [simulate_cell(r, args.profile, args.replications, Path(tmp), received=requests_file(args, r),
                                      extrapolate=args.extrapolate) for r in runs]
                sim = {k: float(np.median([x[k] for x in sims])) for k in sims[0]
                       if all(isinstance(x.get(k), (int, float)) for x in sims)}
            else:
                sim = simulate_cell(runs[0], args.profile, args.replications, Path(tmp), extrapolate=args.extrapolate)
            live = {
                "p50_ms": [r["summary"]["p50_ms"] for r in runs],
                "p99_ms": [r["summary"]["p99_ms"] for r in runs],
                "server_mean_ms": [server_mean_ms(r["triton_delta"]) for r in runs],
                "throughput_rps": [r["summary"]["throughput_rps"] for r in runs],
                "mean_batch_size": [r["summary"]["mean_batch_size"] for r in runs],
            }
            pred = {"p50_ms": sim["p50_ms"] + path_ms, "p99_ms": sim["p99_ms"] + path_ms,
                    "server_mean_ms": sim["mean_ms"], "throughput_rps": sim["throughput_rps"],
                    "mean_batch_size": sim["mean_batch_size"]}
            if args.requests is not None:  # every request, with its batch's response phase
                for r in runs:
                    r["server_side"] = response_ready(requests_file(args, r), r["triton_delta"], WARMUP_S)
            side = [r["server_side"] for r in runs if r["server_side"]]
            if side:  # traced runs only (a server that died kept no trace)
                for q in ("p50", "p99"):
                    live[f"server_{q}_ms"] = [r[f"{q}_ms"] for r in side]
                    pred[f"server_{q}_ms"] = sim[f"{q}_ms"]
            row = {"config": config, "arrival": arrival, "load": load, "runs": len(runs), "traced_runs": len(side),
                   "rate_rps": round(runs[0]["rate_rps"], 1)}
            for k, values in live.items():
                med = float(np.median(values))
                row[f"live_{k}"] = round(med, 4)
                row[f"live_{k}_min"] = round(float(np.min(values)), 4)
                row[f"live_{k}_max"] = round(float(np.max(values)), 4)
                row[f"sim_{k}"] = round(float(pred[k]), 4)
                row[f"err_{k}_pct"] = round(100 * (pred[k] - med) / med, 2)
            if "p99_ms_lo" in sim and "server_p99_ms" in live:
                lo, hi = sim["p99_ms_lo"], sim["p99_ms_hi"]
                row["sim_server_p99_ms_lo"], row["sim_server_p99_ms_hi"] = round(lo, 4), round(hi, 4)
                row["band_covers_median"] = bool(lo <= row["live_server_p99_ms"] <= hi)
                row["band_covers_runs"] = sum(lo <= v <= hi for v in live["server_p99_ms"])
                row["band_half_width_pct"] = round(100 * (hi - lo) / 2 / row["sim_server_p99_ms"], 2)
                row["live_spread_pct"] = round(100 * (row["live_server_p99_ms_max"] - row["live_server_p99_ms_min"])
                                               / row["live_server_p99_ms"], 2)
            if factors is not None and side:
                bands = held_out_bands(args, runs, meta, factors, Path(tmp) / "held-out")
                row["held_out_covers_runs"] = sum(b["p99_ms_lo"] <= r["server_side"]["p99_ms"] <= b["p99_ms_hi"]
                                                  for b, r in zip(bands, runs) if r["server_side"])
                row["held_out_covers_mean_runs"] = sum(b["mean_ms_lo"] <= server_mean_ms(r["triton_delta"])
                                                       <= b["mean_ms_hi"] for b, r in zip(bands, runs))
                row["held_out_half_width_pct"] = round(float(np.median(
                    [100 * (b["p99_ms_hi"] - b["p99_ms_lo"]) / 2 / sim["p99_ms"] for b in bands])), 2)
            if "mean_ms_lo" in sim:
                lo, hi = sim["mean_ms_lo"], sim["mean_ms_hi"]
                row["sim_server_mean_ms_lo"], row["sim_server_mean_ms_hi"] = round(lo, 4), round(hi, 4)
                row["band_covers_mean_runs"] = sum(lo <= v <= hi for v in live["server_mean_ms"])
            rows.append(row)
            print(f"{config:22s} {arrival:8s} {load:.1f}: p99 live {row['live_p99_ms']:7.2f} "
                  f"[{row['live_p99_ms_min']:.2f}-{row['live_p99_ms_max']:.2f}] sim {row['sim_p99_ms']:7.2f} "
                  f"({row['err_p99_ms_pct']:+.1f}%); server mean live {row['live_server_mean_ms']:.3f} "
                  f"sim {row['sim_server_mean_ms']:.3f} ({row['err_server_mean_ms_pct']:+.1f}%); "
                  f"thr {row['err_throughput_rps_pct']:+.2f}%", flush=True)
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / f"fidelity_{args.tag}.csv", index=False)
    thin = table[table.runs < args.min_runs]
    table = table[table.runs >= args.min_runs]
    summary = {"cells_left_out": [f"{r.config} {r.arrival} {r.load:g} ({r.runs} run{'s' if r.runs != 1 else ''})"
                                  for r in thin.itertuples()]}
    for k in ("p50_ms", "p99_ms", "server_mean_ms", "server_p50_ms", "server_p99_ms", "throughput_rps"):
        if f"err_{k}_pct" not in table:
            continue
        e = table[f"err_{k}_pct"].abs()
        summary[k] = {"median_abs_err_pct": round(float(e.median()), 2), "worst_abs_err_pct": round(float(e.max()), 2)}
        for load in sorted(table.load.unique()):
            el = table[table.load == load][f"err_{k}_pct"].abs()
            summary[k][f"load_{load:g}"] = {"median": round(float(el.median()), 2), "worst": round(float(el.max()), 2)}
    if "band_covers_median" in table:
        summary["band"] = {"covers_live_median": f"{int(table.band_covers_median.sum())} of {len(table)}",
                           "covers_live_runs": f"{int(table.band_covers_runs.sum())} of {int(table.traced_runs.sum())}",
                           "half_width_over_live_spread_median": round(float(
                               (table.band_half_width_pct / table.live_spread_pct).median()), 2)}
        if "band_covers_mean_runs" in table:
            summary["band"]["covers_live_mean_runs"] = f"{int(table.band_covers_mean_runs.sum())} of {int(table.runs.sum())}"
    if "held_out_covers_runs" in table:
        summary["held_out_servers"] = {
            "covers_live_runs": f"{int(table.held_out_covers_runs.sum())} of {int(table.traced_runs.sum())}",
            "covers_live_mean_runs": f"{int(table.held_out_covers_mean_runs.sum())} of {int(table.runs.sum())}",
            "half_width_over_live_spread_median": round(float(
                (table.held_out_half_width_pct / table.live_spread_pct).median()), 2)}
    if args.host_record:
        summary["host_record"] = str(args.host_record.name)
    if args.borrow_terms:
        summary["borrowed_terms_from"] = str(args.borrow_terms.name)
    summary["cells"] = len(table)
    summary["profile"] = str(args.profile.name)
    summary["without"] = args.without
    summary["request_path_ms"] = path_ms
    (args.out / f"fidelity_{args.tag}_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
