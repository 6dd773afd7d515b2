"""Why were the dynamic cells' batches ~45 µs slower on the GPU than the profile?

Runs 2 and 3 of the fidelity table (two runners in one process, every cell's warm-up
re-capturing the graphs of the shapes it may launch) measured the CUDA-event time of a
batch-1 replay 45-55 µs above the profile in every cell that could batch, and 7-12 µs
below it in the no-batching cells of the same process; the repeatability run (one runner)
measured 10-18 µs below it in dynamic cells too. This times the same runner in a tight
loop through the states those runs went through:

1. ``A``: one runner, graphs captured for batch 1..64 (the profile's state);
2. ``A+recapture``: run_live's old warm-up re-captured all 64 graphs;
3. ``A+B``: a second runner with its own 64 graphs is made (as run_h200.py did);
4. ``A+B+recapture``: A's 64 graphs re-captured with B alive (a dynamic cell's warm-up);
5. ``A+B+recapture1``: only A's batch-1 graph re-captured (a no-batching cell's warm-up).

    PYTHONPATH=. python3 experiments/fidelity/diagnose_runner_state.py --out "$OUT/runner_state.json"
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

SEQ_LEN = 128
BATCHES = (1, 8, 32)


def timed(runner, batch: int, iters: int, rng: np.random.Generator) -> dict:
    buf = runner.host_input(batch, SEQ_LEN)
    buf[:] = rng.integers(1000, 30000, size=buf.shape)
    for _ in range(30):
        runner.infer(batch, SEQ_LEN, None)
    host, gpu = [], []
    for _ in range(iters):
        runner.infer(batch, SEQ_LEN, None)
        host.append((runner.last_done_ns - runner.last_issue_ns) / 1e6)
        gpu.append(runner.last_gpu_ms)
    return {"host_ms_mean": float(np.mean(host)), "gpu_ms_mean": float(np.mean(gpu)),
            "gpu_ms_p50": float(np.median(gpu))}


def capture_all(runner, largest: int = 64) -> None:
    for b in range(1, largest + 1):
        runner.prepare(b, SEQ_LEN)
        runner.infer(b, SEQ_LEN, None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args(argv)
    import torch

    from schedsim.live.engines.torch_encoder import TorchEncoderRunner, build_encoder

    rng = np.random.default_rng(5)
    model = build_encoder("bert-base", "cuda", torch.float16, seed=0)
    results: dict[str, dict] = {}

    def measure(state: str, batches=BATCHES) -> None:
        t = time.perf_counter()
        results[state] = {str(b): timed(a, b, args.iters, rng) for b in batches}
        results[state]["pool_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
        print(f"{state:<24} " + "  ".join(f"b{b} gpu {results[state][str(b)]['gpu_ms_mean']:.4f} "
                                          f"host {results[state][str(b)]['host_ms_mean']:.4f}" for b in batches)
              + f"  [{time.perf_counter() - t:.1f} s]", flush=True)

    kw = dict(max_batch=64, max_seq_len=SEQ_LEN, cuda_graphs=True, record_gpu_time=True)
    with TorchEncoderRunner(model, **kw) as a:
        capture_all(a)
        measure("A")
        capture_all(a)
        measure("A+recapture")
        with TorchEncoderRunner(model, **kw) as b:
            capture_all(b)
            measure("A+B")
            capture_all(a)
            measure("A+B+recapture")
            a.prepare(1, SEQ_LEN)
            measure("A+B+recapture1", (1,))
            capture_all(a)
            measure("A+B+recapture again")
        measure("A, B closed")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                                    "iters": args.iters, "states": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
