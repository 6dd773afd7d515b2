"""Why do live eager steps take 10-30% longer than the step profile says? (device diagnostic)

Fidelity-llm run 5 logged every live step with its composition. Decode (graph) steps
matched the step model within ±4% at the median, but eager steps (a prefill chunk beside
a few decodes) took 15.4 ms at the median for ~1,000 prompt tokens and 1-8 decodes, where
the profile's own compositions around it (512 or 2048 tokens + 8 decodes at 1,000) give
11.2-15.0 ms. Under 1,024 tokens an eager step costs ~7.5 ms whatever its size: it is
bound by the host launching kernels, so the state of the host matters. This times one
such composition (one fresh prompt of about 1,000 tokens + 4 decodes at 1,500) under
conditions that separate what the live loop does from what the profiler does:

- ``tight-same``: the same length every call, back to back (a warmed shape);
- ``tight-fresh``: a length the engine has not run, every call (the profiler's sampling);
- ``between-decodes``: fresh, and 10 graph decode steps of 32 rows before each (as live);
- ``between-decodes-scattered``: as above with every row's blocks scattered over the pool;
- ``between-decodes-python``: as ``between-decodes`` with ~0.3 ms of Python bookkeeping
  (allocations, dict and list churn) before each eager step, as the live scheduler does.

    PYTHONPATH=. python3 experiments/fidelity-llm/diagnose_eager_steps.py --out "$OUT/eager.json"
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import time_engine_call  # noqa: E402

BLOCKS = 16384
BS = 16


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--model", default="llama-1b", help="llama-tiny with --device cpu checks the script")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)

    import torch

    from schedsim.live.engines.llm_engine import EngineRow, PagedLLMEngine

    rng = np.random.default_rng(0)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    out = {"torch": torch.__version__, "gpu": gpu, "model": args.model, "reps": args.reps, "conditions": {}}
    next_len = [1000]

    def blocks(n_tokens: int, scattered: bool, start: int) -> np.ndarray:
        nb = -(-n_tokens // BS)
        if scattered:
            return rng.choice(np.arange(1, BLOCKS), size=nb, replace=False)
        return np.arange(start, start + nb)

    def eager_rows(n: int, scattered: bool):
        rows = [EngineRow(rng.integers(5, 500, size=n), 0, blocks(n + 1, scattered, 1))]
        for k in range(4):
            rows.append(EngineRow(rng.integers(5, 500, size=1), 1500, blocks(1501, scattered, 200 + k * 100)))
        return rows

    decode_rows = [EngineRow(rng.integers(5, 500, size=1), 1500, np.arange(1000 + k * 100, 1000 + k * 100 + 94))
                   for k in range(32)]

    def busy_python() -> None:
        t = time.perf_counter()
        junk = []
        while time.perf_counter() - t < 3e-4:
            junk.append({"a": list(range(20)), "b": str(len(junk))})

    def condition(name: str, fresh: bool, decodes: bool, scattered: bool, python: bool) -> None:
        wall, gpu = [], []
        for _ in range(args.reps):
            if fresh:
                next_len[0] += 3
            n = next_len[0] if fresh else 1000
            if decodes:
                for _ in range(10):
                    engine.execute(decode_rows)
            if python:
                busy_python()
            w, g = time_engine_call(engine, eager_rows(n, scattered))
            wall.append(w)
            gpu.append(g)
        out["conditions"][name] = {"wall_ms_p50": float(np.median(wall)), "wall_ms_mean": float(np.mean(wall)),
                                   "gpu_ms_p50": float(np.median(gpu)), "graph": bool(engine.last_graph)}
        print(f"{name:28s} wall p50 {np.median(wall):6.2f} mean {np.mean(wall):6.2f}  gpu p50 {np.median(gpu):6.2f} ms",
              flush=True)

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    with PagedLLMEngine(args.model, BLOCKS, BS, args.device, dtype, cuda_graphs=True, seed=0,
                        max_context=16384) as engine:
        for _ in range(3):
            engine.execute(eager_rows(1000, False))
            engine.execute(decode_rows)
        condition("tight-same", False, False, False, False)
        condition("tight-fresh", True, False, False, False)
        condition("between-decodes", True, True, False, False)
        condition("between-decodes-scattered", True, True, True, False)
        condition("between-decodes-python", True, True, False, True)
        condition("tight-same-again", False, False, False, False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
