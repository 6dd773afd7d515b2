"""Is a live eager step slow early in a run because of the GPU, the host, or the launches? (device diagnostic)

diagnose_eager_steps.py found one eager composition (a 1,000-token prefill + 4 decodes)
taking 24.1 ms right after the engine was built and 15.1 ms half a minute later, in the
same process; live cells agree (the eager error is largest in a cell's first 15 s). The
step's GPU-event time fell as much as its wall time, but an eager step's event time
includes the GPU waiting on Python's launches, so that does not say which side it is.

This repeats, for ``--seconds`` in three phases (back to back, then with ``--idle-ms`` of
idle between iterations as at light load, then back to back again), one iteration of:

- ``py_ms``: a fixed pure-Python loop (the host CPU's speed; no GPU);
- ``launch_ms``: 200 tiny in-place GPU ops launched from Python, then a synchronize
  (the host's launch path; the GPU work is negligible);
- ``mm_ms``: a 4096^3 bf16 matrix product timed with CUDA events (the GPU's own speed:
  clocks; no host in it);
- ``decode_gpu_ms``: a 32-row graph decode step at 1,500 tokens (GPU-bound, one launch);
- ``eager_ms`` / ``eager_gpu_ms``: the eager composition, wall and event time.

Each series is written with its time since the engine was built, and summarised per
5-second bin. Run ``nvidia-smi --query-gpu=... -lms 200`` beside it for the clocks.

    PYTHONPATH=. python3 experiments/fidelity-llm/diagnose_drift.py --out "$OUT/drift.json"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

BLOCKS = 16384
BS = 16
SERIES = ("py_ms", "launch_ms", "mm_ms", "decode_gpu_ms", "eager_ms", "eager_gpu_ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each of the three phases")
    ap.add_argument("--idle-ms", type=float, default=50.0, help="idle between iterations in the middle phase")
    ap.add_argument("--model", default="llama-1b", help="llama-tiny with --device cpu checks the script")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cpu", type=int, default=None, help="pin the process to this CPU first")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        import os
        os.sched_setaffinity(0, {args.cpu})

    import torch

    from schedsim.live.engines.llm_engine import EngineRow, PagedLLMEngine
    from schedsim.profiling.host import loop_ms

    cuda = args.device == "cuda"
    rng = np.random.default_rng(0)
    eager_rows = [EngineRow(rng.integers(5, 500, size=1000), 0, np.arange(1, 1 + 63))]
    eager_rows += [EngineRow(rng.integers(5, 500, size=1), 1500, np.arange(200 + k * 100, 200 + k * 100 + 94))
                   for k in range(4)]
    decode_rows = [EngineRow(rng.integers(5, 500, size=1), 1500, np.arange(1000 + k * 100, 1000 + k * 100 + 94))
                   for k in range(32)]
    dtype = torch.bfloat16 if cuda else torch.float32
    mm_n = 4096 if cuda else 256
    a = torch.randn(mm_n, mm_n, device=args.device, dtype=dtype)
    b = torch.randn(mm_n, mm_n, device=args.device, dtype=dtype)
    tiny = torch.zeros(16, device=args.device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def launches() -> float:
        sync()
        t = time.perf_counter()
        for _ in range(200):
            tiny.add_(1.0)
        sync()
        return (time.perf_counter() - t) * 1e3

    def matmul() -> float:
        if not cuda:
            t = time.perf_counter()
            a @ b
            return (time.perf_counter() - t) * 1e3
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(5):
            a @ b
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) / 5

    rows = []
    with PagedLLMEngine(args.model, BLOCKS, BS, args.device, dtype, cuda_graphs=True, seed=0,
                        max_context=16384) as engine:
        t_built, epoch_built = time.perf_counter(), time.time()
        for phase, idle_s in (("busy", 0.0), ("idle-gaps", args.idle_ms / 1e3), ("busy-again", 0.0)):
            t_end = time.perf_counter() + args.seconds
            while time.perf_counter() < t_end:
                r = {"phase": phase, "t_s": time.perf_counter() - t_built, "py_ms": loop_ms(),
                     "launch_ms": launches(), "mm_ms": matmul()}
                engine.execute(decode_rows)
                r["decode_gpu_ms"] = engine.last_gpu_ms if cuda else float("nan")
                t = time.perf_counter()
                engine.execute(eager_rows)
                r["eager_ms"] = (time.perf_counter() - t) * 1e3
                r["eager_gpu_ms"] = engine.last_gpu_ms if cuda else float("nan")
                rows.append(r)
                if idle_s:
                    time.sleep(idle_s)
    bins = summarize(rows)
    for b_ in bins:
        print(f"{b_['phase']:<11} {b_['t0_s']:5.0f}s n={b_['n']:3d} " +
              " ".join(f"{k} {b_[k]:7.3f}" for k in SERIES), flush=True)
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else None,
           "model": args.model, "cpu": args.cpu, "engine_built_epoch_s": epoch_built, "seconds_per_phase": args.seconds, "idle_ms": args.idle_ms,
           "bins_5s_median": bins, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


def summarize(rows: list[dict]) -> list[dict]:
    """Median of each series per phase and 5-second bin of time since the engine was built."""
    out = []
    keys = list(dict.fromkeys((r["phase"], int(r["t_s"] // 5)) for r in rows))  # in time order
    for phase, k in keys:
        sel = [r for r in rows if r["phase"] == phase and int(r["t_s"] // 5) == k]
        out.append({"phase": phase, "t0_s": 5.0 * k, "n": len(sel)}
                   | {s: float(np.median([r[s] for r in sel])) for s in SERIES})
    return out


if __name__ == "__main__":
    sys.exit(main())
