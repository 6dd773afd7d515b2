"""Calibration measurements for the fidelity model, made apart from the validation cells.

Two things a table measured in a tight loop does not show, measured here through the
same engine path as the live runner (TorchEncoderRunner, bert-base fp16, CUDA graphs,
seq_len 128), and nothing here is a validation cell:

1. **Latency after an idle gap.** Batch sizes x idle gaps, interleaved in random order:
   after the previous batch returns, the host waits the gap (busy-wait, for precision),
   then one batch is timed as the live worker times it (the runner's issue and done
   timestamps) with its CUDA-event GPU time.
2. **The live runner's own serving loop.** ``run_live`` on overloaded traces (no
   batching, and dynamic with delay 0), where every launch follows a completion: the
   gap from a batch's completion to the next batch's engine call is the per-batch
   dispatch overhead of the serving loop; and on a light trace, where almost every launch
   wakes an idle loop (thread wake-ups, a cooled host), the extra cost of such a launch.

    export PYTHONPATH=. PYTHONUNBUFFERED=1
    python3 experiments/fidelity/calibrate_h200.py --out "$OUT/calib"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from schedsim.live.driver import run_live, write_batches_csv  # noqa: E402
from schedsim.profiling.measure import machine_metadata  # noqa: E402
from schedsim.registry import build_policy  # noqa: E402
from schedsim.core.policy import Requests  # noqa: E402
from schedsim.traces.table import Trace  # noqa: E402

SEQ_LEN = 128
BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
GAPS_US = (0, 30, 100, 300, 1000, 3000, 10000)


def spin_until(t_ns: int) -> None:
    while time.perf_counter_ns() < t_ns:
        pass


def idle_gap_samples(runner, rounds: int, rng: np.random.Generator) -> dict:
    cells = [(b, g) for b in BATCHES for g in GAPS_US]
    ids = {b: runner.host_input(b, SEQ_LEN) for b in BATCHES}
    for b in BATCHES:
        ids[b][:] = rng.integers(1000, 30000, size=ids[b].shape)
        runner.infer(b, SEQ_LEN, None)
    out = {"batch": [], "gap_us": [], "host_ms": [], "gpu_ms": []}
    last_done = time.perf_counter_ns()
    for _ in range(rounds):
        for k in rng.permutation(len(cells)):
            b, gap = cells[k]
            spin_until(last_done + gap * 1000)
            runner.infer(b, SEQ_LEN, None)
            issue, done = runner.last_issue_ns, runner.last_done_ns
            out["batch"].append(b)
            out["gap_us"].append((issue - last_done) / 1e3)
            out["host_ms"].append((done - issue) / 1e6)
            out["gpu_ms"].append(runner.last_gpu_ms)
            last_done = done
    return {k: np.asarray(v) for k, v in out.items()}


def serving_loop(runner, out: Path, name: str, policy: str, params: dict, rate: float, seconds: float) -> dict:
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds)))
    requests = Requests.from_trace(Trace.from_arrivals(arrivals, seq_len=np.full(len(arrivals), SEQ_LEN)))
    result, extra = run_live(requests, build_policy(policy, params), lambda i: contextlib.nullcontext(runner),
                             instances=1, warmup_s=0.5, default_seq_len=SEQ_LEN, spin_us=0.0,
                             engine_warmup=1, time_limit_s=seconds + 20.0)
    write_batches_csv(out / f"loop_{name}.csv", extra["batches"])
    return {"rate_rps": rate, "requests": len(arrivals), "dispatch_us": extra["dispatch_us"]}


@contextlib.contextmanager
def bert_runner():
    """The cells' engine: bert-base fp16 on CUDA, a graph captured for every batch size 1..64."""
    import torch

    from schedsim.live.engines.torch_encoder import TorchEncoderRunner, build_encoder

    model = build_encoder("bert-base", "cuda", torch.float16, seed=0)
    with TorchEncoderRunner(model, max_batch=64, max_seq_len=SEQ_LEN, cuda_graphs=True,
                            record_gpu_time=True) as runner:
        for b in range(1, 65):
            runner.prepare(b, SEQ_LEN)
        yield runner


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=150)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with bert_runner() as runner:
        idle = idle_gap_samples(runner, args.rounds, np.random.default_rng(3))
        np.savez_compressed(args.out / "idle_gap_samples.npz", **idle)
        print(f"idle-gap samples: {len(idle['batch'])} in {time.perf_counter() - t0:.0f} s", flush=True)
        for b in BATCHES:
            row = [f"{np.mean(idle['host_ms'][(idle['batch'] == b) & (idle['gap_us'] < g * 1.5 + 20) & (idle['gap_us'] >= g)]):.3f}"
                   for g in GAPS_US]
            print(f"batch {b:3d}: host ms by gap {dict(zip(GAPS_US, row))}", flush=True)
        # Overload (~1.3x capacity): every launch follows a completion on the same worker.
        # Light load (~3% of batch-1 capacity): almost every launch wakes an idle loop.
        loops = {"none": serving_loop(runner, args.out, "none", "none", {}, 2100.0, 3.0),
                 "dynamic": serving_loop(runner, args.out, "dynamic", "dynamic",
                                         {"max_batch_size": 64, "max_queue_delay_us": 0}, 23000.0, 3.0),
                 "none_light": serving_loop(runner, args.out, "none_light", "none", {}, 50.0, 4.0),
                 "dynamic_light": serving_loop(runner, args.out, "dynamic_light", "dynamic",
                                               {"max_batch_size": 64, "max_queue_delay_us": 0}, 50.0, 4.0)}
    info = {"loops": loops, "wall_s": time.perf_counter() - t0, "batches": BATCHES, "gaps_us": GAPS_US,
            "rounds": args.rounds, "machine": machine_metadata()}
    (args.out / "calib.json").write_text(json.dumps(info, indent=2, default=str))
    print(json.dumps(loops, indent=1, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
