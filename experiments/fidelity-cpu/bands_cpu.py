"""The CPU fidelity table restated with prediction bands: ONNX Runtime bert-tiny on this
machine, several live runs per cell, and the band's coverage of them.

1. Profile: the engine's batches 1..8 measured as ``fidelity_cpu.py`` does (interleaved,
   idle gaps, raw samples kept), the live driver's dispatch gap, and a ``host_variation``
   record (:func:`schedsim.profiling.host_variation.measure` on the batch-1 call) in the
   sidecar.
2. Predict: one ``schedsim run`` per cell on that profile, with its default 90% band
   (``schedsim.run.runner.execute``, as the command runs it), before any live run.
3. Live: every cell replayed ``--rounds`` times, once per round, with the schedsim live
   driver on one engine session; a batch-1 probe before each round records how far the
   host's speed has moved since the profile.
4. Validate: ``schedsim validate --sim SIM --live L1 L2 ...`` per cell
   (``validate_dirs``): error against the live median, each live run in or out of the
   band, the band's half-width and the live runs' spread.

    python experiments/fidelity-cpu/bands_cpu.py --out /tmp/bands-cpu --rounds 5

Writes OUT/cells.csv (one row per cell and figure), OUT/summary.json (the table's totals,
the host-variation record and the probes) and, per cell, the trace, the prediction, the
live runs and validation.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from schedsim.core.metrics import summarize
from schedsim.core.policy import Requests
from schedsim.cost.model import CostModel
from schedsim.cost.profile import load_profile, save_profile
from schedsim.live.driver import run_live, write_live_outputs
from schedsim.live.engines.ort_live import OrtRunner, build_encoder_onnx
from schedsim.live.validate import validate_dirs
from schedsim.profiling.host_variation import combine, from_batches, measure as measure_host_variation, relative_to
from schedsim.profiling.measure import machine_metadata
from schedsim.run.runner import execute, load_inputs
from schedsim.run.spec import RunSpec, policy_config
from schedsim.traces.generate import poisson
from schedsim.traces.io import save_trace
from schedsim.traces.table import Trace


def _sibling(name: str):
    """A script beside this one, as a module."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FID, RECORDS, FACTORS = _sibling("fidelity_cpu"), _sibling("host_records"), _sibling("host_factors")
SEQ_LEN, MAX_BATCH = FID.SEQ_LEN, FID.MAX_BATCH

# (name, policy, params, load as a fraction of the policy's capacity on the profile)
CELLS = [
    ("none-30", "none", {}, 0.3),
    ("none-60", "none", {}, 0.6),
    ("dynamic-d0-50", "dynamic", {"max_batch_size": MAX_BATCH}, 0.5),
    ("dynamic-d0-80", "dynamic", {"max_batch_size": MAX_BATCH}, 0.8),
    ("dynamic-d1000-30", "dynamic", {"max_batch_size": MAX_BATCH, "max_queue_delay_us": 1000}, 0.3),
    ("dynamic-d1000-60", "dynamic", {"max_batch_size": MAX_BATCH, "max_queue_delay_us": 1000}, 0.6),
    ("static8-w1000-50", "static", {"batch_size": MAX_BATCH, "max_wait_us": 1000}, 0.5),
]
FIGURES = ("p50", "p90", "p99", "mean", "throughput")


def probe_ms(runner, seconds: float = 1.0) -> dict:
    """Batch-1 calls back to back for ``seconds``, median and mean (ms): the host's speed now."""
    ids = np.random.default_rng(0).integers(1000, 30522, size=(1, SEQ_LEN))
    took, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        runner.infer(1, SEQ_LEN, ids)
        took.append(time.perf_counter() - t0)
    return {"batch1_median_ms": float(np.median(took) * 1e3), "batch1_mean_ms": float(np.mean(took) * 1e3)}


def profile(runner, out: Path, rng, *, host_rounds: int, host_round_s: float, host_pause_s: float, min_iters: int,
            min_time_s: float, seed: int, host_records: tuple = ()) -> Path:
    """The profile with its host-variation record (pooled with ``host_records``, earlier
    records of the same call on this machine, after its own: the timeline is relative to
    the host as it was when this table was measured); returns its CSV path."""
    import contextlib

    parts = [FID.measure_samples(runner, rng, min_iters=min_iters, min_time_s=min_time_s)]
    factory = lambda i: contextlib.nullcontext(runner)  # noqa: E731
    gap_us = FID.calibrate_dispatch_us(factory, float(parts[0][1].mean()), seed + 99)
    record = measure_host_variation(RECORDS.idle_call(runner, rng), rounds=host_rounds,
                                    round_s=host_round_s, window_s=0.25, pause_s=host_pause_s,
                                    what=f"one batch of 1 at seq_len {SEQ_LEN} after 0-1 ms idle, wall time around the call")
    # The timeline over the table's own batch-1 mean (the same call): how much slower than the table.
    record = relative_to(record, float(parts[0][1].mean()), "the table's mean at batch 1")
    if host_records:
        record = combine([record, *(json.loads(Path(p).read_text()) for p in host_records)])
    path = FID.save_measured_profile(parts, out / "profile", gap_us)
    prof = load_profile(path)
    meta = dict(prof.meta) | {"host_variation": record}
    save_profile(prof.table, meta, path, samples=prof.samples)
    return path


def host_from_live(runner, out: Path, prof_path: Path, cells, *, rounds: int, duration_s: float, warmup_s: float,
                   seed: int) -> dict:
    """The host record from calibration live runs (the cells' policies and loads on traces of
    other seeds, ``rounds`` rounds): :func:`schedsim.profiling.host_variation.from_batches`,
    written into the profile's sidecar in place of the timed call's record (kept as
    ``host_variation_call``)."""
    import contextlib

    out.mkdir(parents=True, exist_ok=True)
    factory = lambda i: contextlib.nullcontext(runner)  # noqa: E731
    prof = load_profile(prof_path)
    cost = CostModel.from_profile(prof)
    mean_ms = dict(zip(prof.table.batch.astype(int), prof.table.latency_ms_mean))
    runs = []
    for r in range(rounds):
        for i, (name, policy, params, load) in enumerate(cells):
            rate = load * capacity_rps(cost, policy, params)
            arrivals = poisson(rate, rng=np.random.default_rng(seed + 1000 + 100 * r + i), duration_s=duration_s)
            trace = Trace.from_arrivals(arrivals, seq_len=np.full(len(arrivals), SEQ_LEN))
            spec = RunSpec(trace=save_trace(trace, out / f"calibration-{name}-{r + 1}.csv"), policy=policy,
                           params=params, warmup_s=warmup_s)
            inputs = load_inputs(spec)
            live, extra = run_live(inputs.requests, inputs.policy, factory, warmup_s=warmup_s, engine_warmup=1,
                                   default_seq_len=SEQ_LEN)
            d = out / f"calibration-{name}-{r + 1}"
            write_live_outputs(d, live, inputs.trace.request_id, summarize(live, warmup_s), extra,
                               {"backend": "onnxruntime", "model": "bert-tiny", "cell": f"calibration {name}"})
            b, ratio = FACTORS.batches(d, mean_ms, warmup_s)
            runs.append((b.issue_s.to_numpy(), ratio))
    record = from_batches(runs, 0.25, f"the batches of {len(runs)} calibration live runs (the cells' policies and "
                                      "loads, other traces), engine time over the table's mean for the size")
    meta = dict(prof.meta)
    meta["host_variation_call"] = meta.get("host_variation")
    meta["host_variation"] = record
    save_profile(prof.table, meta, prof_path, samples=prof.samples)
    return record


def capacity_rps(cost: CostModel, policy: str, params: dict) -> float:
    b = 1 if policy == "none" else params.get("max_batch_size", params.get("batch_size", 1))
    return b / cost.mean_s(b, SEQ_LEN)


def run(out: Path, *, rounds: int = 5, duration_s: float = 6.0, warmup_s: float = 0.5, seed: int = 0,
        host_rounds: int = 5, host_round_s: float = 2.0, host_pause_s: float = 15.0, round_pause_s: float = 5.0,
        min_iters: int = 200, min_time_s: float = 0.2, cells=CELLS, host_records: tuple = (),
        host_from_live_rounds: int = 0) -> pd.DataFrame:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    probes = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_encoder_onnx("bert-tiny", Path(tmp) / "bert-tiny.onnx")
        with OrtRunner(model, intra_op_threads=1, vocab=30522) as runner:
            import contextlib

            factory = lambda i: contextlib.nullcontext(runner)  # noqa: E731
            probes.append({"when": "before profile", "t_s": 0.0, **probe_ms(runner)})
            t_start = time.monotonic()
            prof_path = profile(runner, out, rng, host_rounds=host_rounds, host_round_s=host_round_s, host_pause_s=host_pause_s,
                                min_iters=min_iters, min_time_s=min_time_s, seed=seed, host_records=host_records)
            if host_from_live_rounds:
                host_from_live(runner, out / "calibration", prof_path, cells, rounds=host_from_live_rounds,
                               duration_s=duration_s, warmup_s=warmup_s, seed=seed)
            cost = CostModel.from_profile(load_profile(prof_path))
            specs = []
            for i, (name, policy, params, load) in enumerate(cells):
                rate = load * capacity_rps(cost, policy, params)
                arrivals = poisson(rate, rng=np.random.default_rng(seed + 100 + i), duration_s=duration_s)
                trace = Trace.from_arrivals(arrivals, seq_len=np.full(len(arrivals), SEQ_LEN))
                (out / name).mkdir(parents=True, exist_ok=True)
                trace_path = save_trace(trace, out / name / "trace.csv")
                spec = RunSpec(trace=trace_path, policy=policy, params=params, profile=prof_path, warmup_s=warmup_s,
                               out=out / name / "sim", overwrite=True)
                execute(spec)   # the prediction, with its band, before any live run
                specs.append((name, load, rate, spec))
            for r in range(rounds):
                if r:
                    time.sleep(round_pause_s)
                probes.append({"when": f"before round {r + 1}", "t_s": time.monotonic() - t_start,
                               **probe_ms(runner)})
                for name, _, _, spec in specs:
                    inputs = load_inputs(spec)
                    live, extra = run_live(inputs.requests, inputs.policy, factory, warmup_s=warmup_s,
                                           engine_warmup=1, default_seq_len=SEQ_LEN)
                    summary = summarize(live, warmup_s)
                    summary["config"] = policy_config(spec, inputs) | {"driver": "live", "backend": "onnxruntime",
                                                                      "model": "builtin:bert-tiny"}
                    write_live_outputs(out / name / f"live-{r + 1}", live, inputs.trace.request_id, summary, extra,
                                       {"backend": "onnxruntime", "model": "bert-tiny", "cell": name})
            probes.append({"when": "after the live rounds", "t_s": time.monotonic() - t_start,
                           **probe_ms(runner)})
    rows = []
    for name, load, rate, spec in specs:
        lives = [out / name / f"live-{r + 1}" for r in range(rounds)]
        report = validate_dirs(spec.out, lives, out=out / name)
        for fig in FIGURES:
            m = report["metrics"][fig]
            rows.append({"cell": name, "load": load, "rate_rps": round(rate, 1), "requests": report["trace_requests"],
                         "figure": fig, "predicted": m["predicted"], "live_median": m["measured"],
                         "err_pct": m["err_pct"], "band_lo": m["predicted_band"][0],
                         "band_hi": m["predicted_band"][1], "runs": len(lives),
                         "runs_in_band": int(sum(m["runs_in_band"])), "median_in_band": m["measured_in_band"],
                         "band_half_width_pct": m["band_half_width_pct"], "live_spread_pct": m["live_spread_pct"],
                         "band_to_live_spread": m["band_to_live_spread"],
                         "live_runs": " ".join(f"{v:.4g}" for v in m["measured_runs"])})
    table = pd.DataFrame(rows)
    table.to_csv(out / "cells.csv", index=False, float_format="%.4g")
    meta = json.loads(prof_path.with_suffix(".json").read_text())
    (out / "summary.json").write_text(json.dumps({
        "totals": totals(table), "probes": probes,
        "host_variation": {k: v for k, v in meta["host_variation"].items() if k != "window_factors"},
        "host_variation_call": {k: v for k, v in (meta.get("host_variation_call") or {}).items()
                                if k != "window_factors"},
        "profile_batch1_ms": float(load_profile(prof_path).table.iloc[0]["latency_ms_p50"]),
        "machine": machine_metadata(probe_torch=False)}, indent=2, default=str))
    return table


def totals(table: pd.DataFrame) -> dict:
    """Per figure: median |error| over cells, coverage of the live runs, median half-width
    over the live spread."""
    out = {}
    for fig, g in table.groupby("figure", sort=False):
        out[fig] = {"cells": len(g), "median_abs_err_pct": float(g.err_pct.abs().median()),
                    "runs_in_band": int(g.runs_in_band.sum()), "runs": int(g.runs.sum()),
                    "coverage": float(g.runs_in_band.sum() / g.runs.sum()),
                    "medians_in_band": int(g.median_in_band.sum()),
                    "median_band_half_width_pct": float(g.band_half_width_pct.median()),
                    "median_live_spread_pct": float(g.live_spread_pct.median()),
                    "median_band_to_live_spread": float(g.band_to_live_spread.median())}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration-s", type=float, default=6.0)
    ap.add_argument("--round-pause-s", type=float, default=5.0)
    ap.add_argument("--host-round-s", type=float, default=2.0)
    ap.add_argument("--host-rounds", type=int, default=5)
    ap.add_argument("--host-pause-s", type=float, default=15.0,
                    help="pause between the host-variation rounds: spread them over minutes, as live runs are")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--host-from-live", type=int, default=0, metavar="ROUNDS",
                    help="take the host record from this many rounds of calibration live runs (the cells' "
                         "policies and loads on traces of other seeds) instead of the timed call")
    ap.add_argument("--host-records", type=Path, nargs="*", default=(),
                    help="earlier host-variation records of this machine (host_records.py) to pool with the profile's")
    args = ap.parse_args(argv)
    table = run(args.out, rounds=args.rounds, duration_s=args.duration_s, round_pause_s=args.round_pause_s,
                host_rounds=args.host_rounds, host_round_s=args.host_round_s, host_pause_s=args.host_pause_s,
                seed=args.seed, host_records=tuple(args.host_records), host_from_live_rounds=args.host_from_live)
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print(table.drop(columns=["live_runs"]).to_string(index=False))
    print(json.dumps(totals(table), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
