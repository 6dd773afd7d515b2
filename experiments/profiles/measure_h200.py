"""Measure the committed H200 profiles in one process (one model build per configuration).

Runs :func:`schedsim.profiling.profiler.run_profile` (what ``schedsim profile`` runs) for each
configuration below, writing NAME.{csv,json,samples.npz} into --out and, after each one,
re-packing everything into --out/profiles.tar.gz (the device tool returns at most 8 files,
and a run cut short by its time limit still returns the profiles finished so far).
Imports numpy, torch, pandas and schedsim's profiler (no simpy, no typer), so it runs on
the device image:

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 experiments/profiles/measure_h200.py --out "$OUT"

``--smoke`` runs every configuration on bert-tiny with a few cells (CPU check).
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import time
from pathlib import Path

from schedsim.profiling.profiler import Progress, ProfileSpec, run_profile

SEQS = (32, 128, 384)
ALL = tuple(range(1, 65))
# (name, precision, cuda_graphs, instances, seq_lens, sampling)
FP16 = dict(warmup_ms=30.0, min_iters=40, min_time_s=0.05, max_cell_s=0.5)
FP32 = dict(warmup_ms=30.0, min_iters=40, min_time_s=0.05, max_cell_s=0.4)
CONFIGS = [
    ("bert-base-fp16-cg-3seq-h200", "fp16", True, 1, SEQS, FP16),
    ("bert-base-fp16-eager-3seq-h200", "fp16", False, 1, SEQS, FP16),
    # The pair-slowdown grid (schedsim.core.contention): 10 sizes alone, 55 pairs, 0.3 s each.
    ("bert-base-fp16-cg-2inst-h200", "fp16", True, 2, (128,),
     FP16 | dict(pair_s=0.3, pair_batches=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64))),
    ("bert-base-fp32-cg-3seq-h200", "fp32", True, 1, SEQS, FP32),
    ("bert-base-fp32-eager-3seq-h200", "fp32", False, 1, SEQS, FP32),
]


class LineProgress(Progress):
    """One line per finished cell (a log, not a live bar: the device's output is a file)."""

    def start(self, cells, spec):
        self.t0 = time.perf_counter()

    def cell_done(self, index, batch, seq_len, stats):
        gpu = stats.get("gpu_ms_mean", float("nan"))
        print(f"  [{time.perf_counter() - self.t0:6.1f}s] b={batch:3d} s={seq_len:3d} "
              f"n={stats['n']:4d} p50={stats['latency_ms_p50']:8.3f} ms gpu={gpu:8.3f} ms"
              f"{'  UNSTABLE' if stats['unstable'] else ''}")

    def note(self, text):
        print(f"  {text}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated names to run")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, precision, graphs, k, seqs, sampling in CONFIGS:
        if args.only and name not in args.only.split(","):
            continue
        model, batches = "builtin:bert-base", ALL
        if args.smoke:
            model, batches, seqs = "builtin:bert-tiny", (1, 2, 3), (16, 32)[:len(seqs)]
            sampling = dict(warmup_ms=5.0, min_iters=5, min_time_s=0.0, max_cell_s=0.2,
                            pair_s=0.05 if k == 2 else 0.0, pair_batches=(1, 3) if k == 2 else None)
            name = name.replace("bert-base", "bert-tiny")
        spec = ProfileSpec(model=model, backend="torch", precision=precision,
                           batch_sizes=batches, seq_lens=seqs, cuda_graphs=graphs,
                           instances=k, dispatch_iters=300, **sampling)
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        o = run_profile(spec, out / f"{name}.csv", LineProgress(),
                        command=f"experiments/profiles/measure_h200.py ({name})")
        print(f"== {name}: {o.cells} cells, {time.perf_counter() - t0:.0f} s, "
              f"{len(o.warnings)} warnings: {o.warnings[:3]}", flush=True)
        with tarfile.open(out / "profiles.tar.gz.tmp", "w:gz") as tar:
            for f in sorted(out.glob("*-h200.*")):
                tar.add(f, arcname=f.name)
        (out / "profiles.tar.gz.tmp").replace(out / "profiles.tar.gz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
