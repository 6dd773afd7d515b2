"""The fidelity table's device half: live runs of every cell on the H200, plus a fresh
cost profile measured in the same call. The simulator half is analyze.py (run it here).

Runs on the device image (Python 3.12, torch with CUDA, numpy; no simpy, maybe no
pyarrow): it imports only numpy, torch, schedsim.live.driver, schedsim.core.metrics, the policies
and schedsim.live.engines.torch_encoder; none of them imports simpy (the result type lives in
schedsim.core.results).

Per cell (see cells.py) it writes OUT/cells/NAME/: result.npz (the arrivals replayed, in
ns, and every per-request and per-batch column; analyze.py rebuilds requests.csv from
it, which keeps the device's output small), summary.json, batches.csv and live.json.
A cell's trace lasts --duration-s, shortened for fast cells to about --max-requests
(at least 3 s); the first --warmup-s are left out of every figure. OUT/profile/ holds the same-call profile (experiments/default_profile/measure.py,
shortened). Cells already finished (a summary.json) are skipped, so a rerun into the same
OUT resumes; --budget-s stops starting cells before the device's 10-minute limit.

--cpu (default auto: the fastest CPU by a short probe) pins this process before torch
starts, and the profile's child process to the same CPU: the machine's vCPUs switch
between two speeds and the host-bound work (graph launches, the dispatcher) with them
(schedsim/profiling/host.py). The choice is in run_info.json and every cell's live.json
(cpu_pinning).

    export PYTHONPATH=. PYTHONUNBUFFERED=1
    python3 experiments/fidelity/run_h200.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.fidelity.cells import CELLS, capacity_rps, committed_profile_means  # noqa: E402
from schedsim.errors import InputError  # noqa: E402
from schedsim.files import json_safe  # noqa: E402
from schedsim.profiling.host import live_cpu_count, pin_cpu, probe_cpus, set_process_cpus  # noqa: E402
from schedsim.live.driver import run_live, write_batches_csv  # noqa: E402
from schedsim.core.metrics import summarize  # noqa: E402
from schedsim.registry import build_policy  # noqa: E402
from schedsim.core.policy import Requests  # noqa: E402
from schedsim.traces.table import Trace  # noqa: E402

SEQ_LEN = 128
MAX_BATCH = 64


def make_arrivals(cell: dict, rate: float, duration_s: float) -> np.ndarray:
    """Poisson or gamma renewal arrivals at ``rate`` for ``duration_s`` (seeded per cell)."""
    rng = np.random.default_rng(cell["seed"])
    n = int(rate * duration_s * 1.2) + 100
    cv = cell.get("cv", 1.0)
    if cv == 1.0:
        gaps = rng.exponential(1.0 / rate, n)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    t = np.cumsum(gaps)
    return t[t < duration_s]


def write_cell(cell_dir: Path, cell: dict, trace: Trace, result, extra: dict, warmup_s: float, info: dict) -> None:
    import json as _json

    cell_dir.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(cell_dir / "result.npz", start_ns=result.start_ns, end_ns=result.end_ns,
                        batch_size=result.batch_size, instance=result.instance, status=result.status,
                        batch_start_ns=result.batch_start_ns, batch_end_ns=result.batch_end_ns,
                        batch_instance=result.batch_instance, batch_samples=result.batch_samples,
                        batch_requests=result.batch_requests, arrival_ns=result.requests.arrival_ns)
    write_batches_csv(cell_dir / "batches.csv", extra["batches"])
    stats = {k: v for k, v in extra.items() if k != "batches"}
    (cell_dir / "live.json").write_text(_json.dumps(json_safe(info | stats | {"cell": cell}), indent=2, default=str))
    summary = summarize(result, warmup_s)
    summary["partial"] = bool(extra["partial"])
    summary["live"] = {k: stats[k] for k in ("issue_lateness_us", "timer_lateness_us", "dispatch_us",
                                             "completion_gap_us", "engine_host_ms", "engine_gpu_ms")}
    summary["config"] = {"trace": "result.npz:arrival_ns", "policy": cell["policy"], "params": cell["params"],
                         "instances": cell["instances"], "warmup_s": warmup_s, "rate_scale": 1.0,
                         "driver": "live", "backend": "torch", "model": "builtin:bert-base", "device": "cuda",
                         "precision": "fp16", "cuda_graphs": True, "spin_us": cell.get("spin_us", 0.0)}
    # requests.csv is left to analyze.py (from result.npz): it is the bulk of the output.
    (cell_dir / "summary.json").write_text(_json.dumps(json_safe(summary), indent=2, sort_keys=True) + "\n")


def _record(probe: dict) -> dict:
    """A CPU probe (schedsim.profiling.host.probe_cpus) as live.json keeps it: loop ms by CPU."""
    return {str(c): round(v, 4) for c, v in probe.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--cells", default="", help="comma-separated substrings: only matching cells")
    ap.add_argument("--duration-s", type=float, default=7.0, help="trace length per cell (warm-up included)")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--max-requests", type=int, default=40_000, help="shorten fast cells to about this many")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no cell after this much wall time")
    ap.add_argument("--skip-profile", action="store_true", help="do not measure the same-call profile")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the selected cells this many times, interleaved (repeat k>1 as NAME~rk): "
                         "the live-vs-live spread of the same trace")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check of this script: bert-tiny, fp32, eager, rates x0.02, no profile")
    ap.add_argument("--cpu", default="auto",
                    help="pin to this CPU: a number, auto (the fastest by a short probe) or none")
    ap.add_argument("--power-cap", action="store_true",
                    help="first measure this GPU's power cap (diagnose_gpu_load.py, a child process, "
                         "about 60 s) into OUT/gpu_load: analyze.py's model g")
    ap.add_argument("--smi-ms", type=int, default=50,
                    help="sample nvidia-smi (SM clock, power, temperature) every this many ms during the "
                         "cells into OUT/smi.csv; each cell's live.json has its wall-clock span; 0: off")
    ap.add_argument("--repin", action="store_true",
                    help="with --cpu auto: probe every CPU again before each cell and run it on the "
                         "fastest now (a vCPU's speed changes from minute to minute)")
    args = ap.parse_args(argv)
    selected = [c for c in CELLS if not args.cells or any(s in c["name"] for s in args.cells.split(","))]
    try:
        # Before torch and CUDA start their threads (they inherit the CPU set). A cell runs on
        # schedsim live's choice (live_cpu_count: one CPU per instance plus one for the load
        # generator), the fastest first; set_process_cpus moves every thread per cell.
        most = max([c["instances"] for c in selected] + [2])
        pinning = pin_cpu(None if args.cpu.strip().lower() == "none" else args.cpu, count=live_cpu_count(most))
    except InputError as exc:
        ap.error(str(exc))
    if pinning:
        set_process_cpus(pinning["cpus"][:live_cpu_count(1)])
        print(f"pinned to CPUs {pinning['cpus'][:live_cpu_count(1)]} (one instance), {pinning['cpus']} (up to {most}) "
              f"({pinning['how']}; loop {pinning['loop_ms']:.3f} ms on {pinning['cpu']})", flush=True)

    import torch

    from schedsim.live.engines.torch_encoder import TorchEncoderRunner, build_encoder
    from schedsim.profiling.measure import gpu_sampler, gpu_state, machine_metadata

    t_start = time.perf_counter()
    out = args.out
    (out / "cells").mkdir(parents=True, exist_ok=True)
    print(f"command: {' '.join(sys.argv)}", flush=True)
    gpu_before = gpu_state()
    device, name, dtype, scale = ("cpu", "bert-tiny", torch.float32, 0.02) if args.smoke else \
        ("cuda", "bert-base", torch.float16, 1.0)
    if not args.skip_profile and not args.smoke and not (out / "profile" / "samecall.csv").exists():
        # The default profile's method, shortened (about 40 s instead of 2 min), in a child
        # process: its runner must not share this process with the cells' runner (a second
        # runner's graphs slow the first one's small batches; diagnose_runner_state.py).
        subprocess.run([sys.executable, str(ROOT / "experiments/default_profile/measure.py"),
                        "--out", str(out / "profile"), "--name", "samecall", "--min-iters", "120",
                        "--min-time-s", "0.25", "--warmup-ms", "50", "--dispatch-iters", "1000"]
                       + (["--cpu", str(pinning["cpu"])] if pinning else []),
                       check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        print(f"profile done at {time.perf_counter() - t_start:.0f} s", flush=True)

    if args.power_cap and not args.smoke and not (out / "gpu_load" / "batches.csv.gz").exists():
        # In a child process too, with its own runner (see the profile above); it inherits the
        # CPUs this process is pinned to.
        subprocess.run([sys.executable, str(ROOT / "experiments/fidelity/diagnose_gpu_load.py"),
                        "--out", str(out / "gpu_load"), "--cpu", "none"],
                       check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        subprocess.run(["gzip", "-f", str(out / "gpu_load" / "batches.csv")], check=True)
        print(f"power cap measured at {time.perf_counter() - t_start:.0f} s", flush=True)
    means = committed_profile_means(ROOT / "profiles" / "bert-base-fp16-cg-h200.csv")
    model = build_encoder(name, device, dtype, seed=0)
    cells = [c if k == 0 else dict(c, name=f"{c['name']}~r{k + 1}") for k in range(args.repeat) for c in selected]
    # One-instance cells first, while the process holds one runner: a second runner's graphs,
    # once made, slow the first runner's small batches by ~45 us on the GPU for the rest of
    # the process (diagnose_runner_state.py), and the profile was measured with one runner.
    cells.sort(key=lambda c: c["instances"])
    with contextlib.ExitStack() as stack:
        smi = stack.enter_context(gpu_sampler(out / "smi.csv", args.smi_ms)) if args.smi_ms > 0 else None
        runners: list = []

        def ensure_runners(n: int) -> None:
            while len(runners) < n:
                t0 = time.perf_counter()
                r = stack.enter_context(TorchEncoderRunner(model, max_batch=MAX_BATCH, max_seq_len=SEQ_LEN,
                                                           cuda_graphs=True, record_gpu_time=True))
                for b in range(1, MAX_BATCH + 1):
                    r.prepare(b, SEQ_LEN)
                runners.append(r)
                print(f"runner {len(runners)}: captured {len(r.graph_shapes)} graphs in "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)

        done, skipped = [], []
        for cell in cells:
            cell_dir = out / "cells" / cell["name"]
            if (cell_dir / "summary.json").exists():
                continue
            if time.perf_counter() - t_start > args.budget_s:
                skipped.append(cell["name"])
                continue
            rate = cell["load"] * capacity_rps(cell, means) * scale
            duration = min(args.duration_s, max(3.0, args.warmup_s + args.max_requests / rate))
            arrivals = make_arrivals(cell, rate, duration)
            trace = Trace.from_arrivals(arrivals, seq_len=np.full(len(arrivals), SEQ_LEN))
            requests = Requests.from_trace(trace)
            policy = build_policy(cell["policy"], dict(cell["params"]))
            ensure_runners(cell["instances"])
            cell_cpus = pinning["cpus"][:live_cpu_count(cell["instances"])] if pinning else None
            host: dict = {}
            if pinning and args.repin and pinning["how"] == "auto":
                probe = probe_cpus(pinning["allowed_cpus"], rounds=2, loops=5)
                cell_cpus = sorted(probe, key=probe.get)[:live_cpu_count(cell["instances"])]
                host["probe_before_ms"] = _record(probe)
            if pinning:
                set_process_cpus(cell_cpus)
                if smi:
                    smi.avoid(cell_cpus)
                # The cell's own CPUs, just before and after it: did the host change speed?
                host["loop_ms_before"] = _record(probe_cpus(cell_cpus))
            t0, wall_start = time.perf_counter(), time.time()
            result, extra = run_live(requests, policy, lambda i: contextlib.nullcontext(runners[i]),
                                     instances=cell["instances"], warmup_s=args.warmup_s,
                                     default_seq_len=SEQ_LEN, spin_us=cell.get("spin_us", 0.0),
                                     engine_warmup=1, time_limit_s=duration + 20.0)
            if pinning:
                host["loop_ms_after"] = _record(probe_cpus(cell_cpus))
            info = {"rate_rps": rate, "duration_s": duration, "wall_s": time.perf_counter() - t0,
                    "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "smoke": args.smoke,
                    "cpu_pinning": pinning,
                    "cpus": cell_cpus, "host": host, "wall_epoch_s": [wall_start, time.time()]}
            write_cell(cell_dir, cell, trace, result, extra, args.warmup_s, info)
            s = summarize(result, args.warmup_s)
            done.append(cell["name"])
            print(f"{cell['name']:<34} {rate:8.0f} req/s  p50 {s['p50_ms']:7.3f}  p99 {s['p99_ms']:7.3f} ms  "
                  f"batch {s['mean_batch_size']:5.1f}  late p99 {extra['issue_lateness_us'].get('p99', 0):6.1f} us  "
                  f"dispatch {extra['dispatch_us'].get('mean', 0):5.1f} us  [{time.perf_counter() - t_start:.0f} s]",
                  flush=True)
    meta = machine_metadata(gpu_before)
    (out / "run_info.json").write_text(json.dumps(json_safe({
        "cells_done": done, "cells_skipped_budget": skipped, "wall_s": time.perf_counter() - t_start,
        "duration_s": args.duration_s, "warmup_s": args.warmup_s, "cpu_pinning": pinning,
        "smi": smi.started if smi else None, "machine": meta}), indent=2, default=str))
    print(f"done {len(done)} cells, skipped {len(skipped)} for the budget, {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
