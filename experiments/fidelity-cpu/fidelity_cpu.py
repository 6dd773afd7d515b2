"""The reduced fidelity table on the CPU: ONNX Runtime, bert-tiny, this machine.

Measures a cost profile of the engine here (as experiments/default_profile/measure.py
does on the H200: warm-up, interleaved rounds, every raw sample kept) plus the live
driver's own dispatch gap, then replays one trace per cell live against the engine
(``schedsim.live.driver.run_live``) in ``live_repeats`` rounds, every cell once a round, with another
profile measured before each round, and simulates each trace on the profile of its round
(``schedsim.core.simulate``) and compares them (``schedsim.live.validate.compare``; each error is the
median over the rounds).

``--cost-scale 1.3`` simulates on a profile whose latencies are 30% too high: the
check must then fail (tests/fidelity/test_cpu_table.py runs both).

    python experiments/fidelity-cpu/fidelity_cpu.py --out /tmp/fid-cpu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from policies import DynamicBatcher, NoBatching
from schedsim.cost.model import CostModel
from schedsim.live.engines.ort_live import OrtRunner, build_encoder_onnx
from schedsim.live.driver import run_live, write_live_outputs
from schedsim.profiling.measure import interleaved, machine_metadata, summarize as sample_stats
from schedsim.core.metrics import combine_replications, summarize
from schedsim.core.policy import Requests
from schedsim.cost.profile import Profile, save_profile
from schedsim.run.report import write_outputs
from schedsim.core.simulate import simulate
from schedsim.traces.table import Trace
from schedsim.traces.generate import poisson
from schedsim.live.validate import compare

SEQ_LEN = 32
MAX_BATCH = 8
# (name, policy factory, load as a fraction of the policy's capacity)
CELLS = [
    ("none-60", lambda: NoBatching(), 0.6),
    ("dynamic-d0-50", lambda: DynamicBatcher(max_batch_size=MAX_BATCH), 0.5),
    ("dynamic-d1000-30", lambda: DynamicBatcher(max_batch_size=MAX_BATCH, max_queue_delay_us=1000), 0.3),
]
TOLERANCE_PCT = {"p50": 60.0, "throughput": 5.0}
"""Wide: on a shared 2-core machine the engine drifts by 20-30% within minutes and is slower
after idle stretches. A 30% cost error still moves the loaded cells by far more (+95..290% at
p50 in at least one of them). The mean is not held to a tolerance: it carries the tail, which
a stall of the other core moves by tens of percent (README); the test checks instead that a
30% cost error moves it by more than 30 points over the honest profile's."""


def measure_samples(runner, rng, *, min_iters: int, min_time_s: float) -> dict[int, np.ndarray]:
    """Raw latencies (ms) of batches 1..MAX_BATCH, interleaved, with idle gaps between calls."""
    batches = list(range(1, MAX_BATCH + 1))
    ids = rng.integers(1000, 30522, size=(MAX_BATCH, SEQ_LEN))
    cells = {b: (lambda b=b: runner.infer(b, SEQ_LEN, ids[:b])) for b in batches}
    # Idle gaps between calls, as a serving loop below saturation has: on a CPU the first
    # call after an idle stretch is slower (caches, clocks), and back-to-back timing
    # understated live batches by 15-30% here.
    idle = rng.uniform(0.0, 1e-3, size=100_000)
    k = iter(range(10**9))
    res = interleaved(cells, rng, warmup_s=0.02, min_iters=min_iters, min_time_s=min_time_s, per_visit=1,
                      after=lambda _: time.sleep(idle[next(k) % idle.size]))
    return {b: np.asarray(x) for b, x in res.by_cell().items()}


def save_measured_profile(parts: list[dict], out_dir: Path, dispatch_us: float | None = None) -> Path:
    """A profile of the measured parts' samples, pooled."""
    rows, samples = [], {}
    for b in sorted(parts[0]):
        x = np.concatenate([p[b] for p in parts])
        st = sample_stats(x)
        rows.append({"batch": b, "seq_len": SEQ_LEN, **{k: st[k] for k in (
            "latency_ms_mean", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99", "latency_ms_std",
            "n", "latency_ms_min", "latency_ms_max")}})
        samples[(b, SEQ_LEN)] = x.astype(np.float32)
    df = pd.DataFrame(rows).sort_values("batch")
    meta = {"model": "bert-tiny (onnx.helper, random weights)", "backend": "onnxruntime", "device": "cpu",
            "timing": "host time around InferenceSession.run", "parts": len(parts)}
    if dispatch_us is not None:
        meta["dispatch_overhead_us"] = dispatch_us
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bert-tiny-ort-cpu.csv"
    save_profile(df, meta, path, samples=samples)
    return path


def calibrate_dispatch_us(factory, batch1_ms: float, seed: int) -> float:
    """The live driver's own overhead per batch: mean time from what triggered a launch (a
    completion, a due timer or arrival) to the engine call, in a separate calibration run
    at half the load batch-1 requests can take (a saturated loop would understate the
    wake-up cost of arrival-triggered launches, and overstate nothing the cells see)."""
    arrivals = poisson(0.5e3 / batch1_ms, rng=np.random.default_rng(seed), duration_s=1.5)
    req = Requests.from_trace(Trace.from_arrivals(arrivals, seq_len=np.full(len(arrivals), SEQ_LEN)))
    _, extra = run_live(req, DynamicBatcher(max_batch_size=MAX_BATCH), factory, engine_warmup=1)
    return float(np.nanmean(extra["batches"]["gap_us"]))


def capacity_rps(cost: CostModel, policy) -> float:
    b = 1 if isinstance(policy, NoBatching) else policy.max_batch_size
    return b / cost.mean_s(b, SEQ_LEN)


def run(out: Path, *, duration_s: float = 4.0, warmup_s: float = 0.5, cost_scales=(1.0,),
        min_iters: int = 60, min_time_s: float = 0.05, replications: int = 3, seed: int = 0,
        live_repeats: int = 3) -> pd.DataFrame:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_encoder_onnx("bert-tiny", Path(tmp) / "bert-tiny.onnx")
        with OrtRunner(model, intra_op_threads=1, vocab=30522) as runner:
            factory = lambda i: contextlib.nullcontext(runner)  # noqa: E731
            measure = lambda: measure_samples(runner, rng, min_iters=min_iters, min_time_s=min_time_s)  # noqa: E731
            parts = [measure()]
            batch1_ms = float(parts[0][1].mean())
            gap_us = calibrate_dispatch_us(factory, batch1_ms, seed + 99)
            from schedsim.cost.profile import load_profile

            # Trace rates from the first part; the cells are then run live in rounds (every
            # cell once per round), with another profile part before each later round.
            first = CostModel.from_profile(load_profile(save_measured_profile(parts, out / "profile-r1", gap_us)))
            cells = []
            for i, (name, make, load) in enumerate(CELLS):
                rate = load * capacity_rps(first, make())
                arrivals = poisson(rate, rng=np.random.default_rng(seed + 100 + i), duration_s=duration_s)
                trace = Trace.from_arrivals(arrivals, seq_len=np.full(len(arrivals), SEQ_LEN))
                cells.append((name, make, load, rate, trace, []))
            for r in range(live_repeats):
                if r > 0:
                    parts.append(measure())
                for name, make, load, rate, trace, lives in cells:
                    live, extra = run_live(Requests.from_trace(trace), make(), factory, warmup_s=warmup_s,
                                           engine_warmup=1)
                    live_summary = summarize(live, warmup_s)
                    live_summary["config"] = {"policy": name, "warmup_s": warmup_s}
                    live_dir = out / name / ("live" if r == 0 else f"live-r{r + 1}")
                    write_live_outputs(live_dir, live, trace.request_id, live_summary, extra,
                                       {"backend": "onnxruntime", "model": "bert-tiny", "cell": name})
                    lives.append((live_dir, live_summary, extra))
            # Each round's live runs are compared with a simulation on the profile part measured
            # just before them: on a shared machine the engine's speed drifts within minutes.
            profiles = [load_profile(save_measured_profile([part], out / f"profile-r{r + 1}", gap_us))
                        for r, part in enumerate(parts)]
            rows = []
            for name, make, load, rate, trace, lives in cells:
                req = Requests.from_trace(trace)
                for scale in cost_scales:
                    vs = []
                    for r, profile in enumerate(profiles):
                        c = CostModel.from_profile(_scaled(profile, scale))
                        sims = [simulate(req, make(), c, seed=1 + k) for k in range(replications)]
                        sums = [summarize(s, warmup_s) for s in sims]
                        sim_summary = combine_replications(sums) if replications > 1 else sums[0]
                        sim_summary["config"] = lives[r][1]["config"]
                        sim_dir = out / name / f"sim-x{scale:g}" / f"r{r + 1}"
                        write_outputs(sim_dir, sims[0], trace.request_id, sim_summary)
                        vs.append(_compare(sim_dir, lives[r][0]))
                    # One live run in a few meets a stall of the shared machine's other core:
                    # the median over the rounds is the measurement (as pooled.py does).
                    med = lambda f: float(np.median([f(v) for v in vs]))  # noqa: E731
                    rows.append({"cell": name, "cost_scale": scale, "load": load, "rate_rps": rate,
                                 "requests": len(req), "live_repeats": live_repeats,
                                 **{f"{k}_err_pct": med(lambda v, k=k: v[f"{k}_err_pct"]) for k in
                                    ("p50", "p90", "p99", "mean", "throughput", "mean_batch_size")},
                                 "ks_stat": med(lambda v: v["ks_stat"]),
                                 "measured_p50_ms": float(np.median([ls["p50_ms"] for _, ls, _ in lives])),
                                 "predicted_p50_ms": sim_summary["p50_ms"],
                                 "issue_lateness_us_mean": _median_of(
                                     [e["issue_lateness_us"].get("mean") for _, _, e in lives]),
                                 "completion_gap_us_mean": _median_of(
                                     [e["completion_gap_us"].get("mean") for _, _, e in lives]),
                                 "model_dispatch_us": gap_us})
    table = pd.DataFrame(rows)
    table["ok"] = table.apply(within_tolerance, axis=1)
    table.to_csv(out / "fidelity_cpu.csv", index=False, float_format="%.4g")
    (out / "machine.json").write_text(json.dumps(machine_metadata(probe_torch=False), indent=2, default=str))
    return table


def _median_of(values) -> float:
    """Median of the runs' figures that exist (a saturated run has no arrival-triggered
    launch, so no issue lateness); NaN when none does."""
    have = [v for v in values if v is not None]
    return float(np.median(have)) if have else float("nan")


def within_tolerance(row) -> bool:
    return all(abs(row[f"{k}_err_pct"]) <= tol for k, tol in TOLERANCE_PCT.items())


def _scaled(profile: Profile, scale: float) -> Profile:
    if scale == 1.0:
        return profile
    table = profile.table.copy()
    for col in [c for c in table.columns if c.startswith("latency_ms_")]:
        table[col] = table[col] * scale
    samples = {k: v * scale for k, v in profile.samples.items()} if profile.samples is not None else None
    return Profile.from_frame(table, dict(profile.meta), samples, profile.path)


def _compare(sim_dir: Path, live_dir: Path) -> dict:
    from schedsim.live.validation import load_run_dir

    sim, sim_cols = load_run_dir(sim_dir, "--sim")
    live, live_cols = load_run_dir(live_dir, "--live")
    v = compare(sim, live, sim_cols, live_cols)
    v.pop("_latencies")
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--duration-s", type=float, default=8.0)
    ap.add_argument("--cost-scale", type=float, action="append", help="also simulate with latencies x this")
    args = ap.parse_args(argv)
    table = run(args.out, duration_s=args.duration_s, cost_scales=[1.0] + (args.cost_scale or []),
                min_iters=200, min_time_s=0.2, replications=5)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.drop(columns=["model_dispatch_us"]).to_string(index=False))
    return 0 if table[table.cost_scale == 1.0]["ok"].all() else 1


if __name__ == "__main__":
    sys.exit(main())
