"""Two instances on one GPU with different batch sizes: how much does each slow the other?

The two-instance profile (profiles/bert-base-fp16-cg-2inst-h200.csv) was measured with both
instances running the same batch size. Live, a large batch mostly runs beside the other
instance's small one (README: batches of 33-64 took 2.78 ms live and 4.23 ms in
the simulation). This runs two CUDA-graph runners of bert-base (fp16, seq_len 128), one
thread each (schedsim.profiling.measure.sample_concurrent, as the profiler's 2-instance cells), for
pairs of sizes (a, b), and each size alone, and writes each side's host latency and GPU
time, medians (device; about a minute):

    PYTHONPATH=. python3 experiments/fidelity/diagnose_asymmetric_contention.py --out "$OUT/asym.json"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schedsim.profiling.host import live_cpu_count, pin_cpu  # noqa: E402
from schedsim.profiling.measure import sample_cell, sample_concurrent  # noqa: E402

SEQ_LEN = 128
PAIRS = [(64, 64), (64, 16), (64, 4), (64, 1), (48, 48), (48, 8), (48, 2), (32, 32), (32, 8), (32, 1),
         (16, 16), (16, 2), (8, 8), (8, 1), (2, 2)]


def medians(res, instance: int) -> dict:
    pick = res.instance == instance
    gpu = np.asarray(res.after, dtype=float)[pick]
    return {"host_ms": float(np.median(res.latency_ms[pick])), "gpu_ms": float(np.nanmedian(gpu)),
            "n": int(pick.sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--time-s", type=float, default=1.0, help="timed seconds per pair")
    ap.add_argument("--smoke", action="store_true", help="CPU check: bert-tiny, eager")
    args = ap.parse_args(argv)
    pinning = pin_cpu("auto", count=live_cpu_count(2))

    import torch

    from schedsim.live.engines.torch_encoder import TorchEncoderRunner, build_encoder

    device, name, dtype = ("cpu", "bert-tiny", torch.float32) if args.smoke else ("cuda", "bert-base", torch.float16)
    model = build_encoder(name, device, dtype, seed=0)
    kw = dict(max_batch=64, max_seq_len=SEQ_LEN, cuda_graphs=not args.smoke, record_gpu_time=True)
    sizes = sorted({s for p in PAIRS for s in p})
    out = {"pairs": [], "alone": {}, "cpu_pinning": pinning, "model": name}
    with TorchEncoderRunner(model, **kw) as one, TorchEncoderRunner(model, **kw) as two:
        for b in sizes:
            one.prepare(b, SEQ_LEN)
            two.prepare(b, SEQ_LEN)
        common = dict(warmup_s=0.1, min_iters=50, min_time_s=args.time_s)
        for b in sizes:
            res = sample_cell(lambda b=b: one.infer(b, SEQ_LEN), after=lambda: one.last_gpu_ms, **common)
            out["alone"][str(b)] = medians(res, 0)
        for a, b in PAIRS:
            res = sample_concurrent([lambda a=a: one.infer(a, SEQ_LEN), lambda b=b: two.infer(b, SEQ_LEN)],
                                    after=[lambda: one.last_gpu_ms, lambda: two.last_gpu_ms], **common)
            row = {"a": a, "b": b, "a_side": medians(res, 0), "b_side": medians(res, 1)}
            out["pairs"].append(row)
            print(f"{a:3d} beside {b:3d}: {row['a_side']['host_ms']:.3f} ms (alone {out['alone'][str(a)]['host_ms']:.3f}); "
                  f"{b:3d} beside {a:3d}: {row['b_side']['host_ms']:.3f} ms (alone {out['alone'][str(b)]['host_ms']:.3f})",
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
