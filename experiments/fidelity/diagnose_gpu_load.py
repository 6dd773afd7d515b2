"""Does the GPU run a batch slower after a spell of heavy work? (device, about 60 s)

In the 90% cells of run 9 (2026-11-30, `results-run9/`, eight cells) the CUDA-event time of a batch
was 0.7% under the profile's when the eight batches before it averaged 30 samples or
fewer, and 2.8-3.3% over it when they averaged more than 50, at the same batch size.
That can be cause (the GPU slows under sustained load: power or temperature) or effect
(a slow spell builds the queue, which makes the next batches large). This script sets
the load itself, so only the first can show:

- ``mix``: the profile's own pattern (random sizes 1-64, four back-to-back per visit);
- ``steady-B``: back-to-back batches of B samples (B = 8, 16, 32, 48, 64), every 8th a
  batch-32 probe;
- ``step``: batch-32 probes throughout, then 64s, then 8s, then 32s again, each 2 s:
  how fast the slowdown sets in and goes away;
- ``idle``: 1 s with nothing, then probes.

Every batch is timed by CUDA events (``gpu_ms``) and on the host (``host_ms``), with its
start time. ``nvidia-smi`` samples the SM clock, power and temperature every 20 ms in the
background (``smi.csv``), when it exists. Writes OUT/gpu_load/{batches.csv, smi.csv,
run.json}.

    PYTHONPATH=. python3 experiments/fidelity/diagnose_gpu_load.py --out "$OUT/gpu_load"
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from schedsim.profiling.host import pin_cpu  # noqa: E402
from schedsim.profiling.measure import gpu_sampler  # noqa: E402

SEQ_LEN = 128
PROBE = 32


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")) / "gpu_load")
    ap.add_argument("--phase-s", type=float, default=4.0, help="seconds per steady phase")
    ap.add_argument("--cpu", default="auto")
    ap.add_argument("--smoke", action="store_true", help="CPU check: bert-tiny, eager, short phases")
    args = ap.parse_args(argv)
    pinning = pin_cpu(None if args.cpu == "none" else args.cpu)

    import torch

    from schedsim.live.engines.torch_encoder import TorchEncoderRunner, build_encoder

    args.out.mkdir(parents=True, exist_ok=True)
    device, name, dtype = ("cpu", "bert-tiny", torch.float32) if args.smoke else ("cuda", "bert-base", torch.float16)
    phase_s = 0.3 if args.smoke else args.phase_s
    rng = np.random.default_rng(0)
    model = build_encoder(name, device, dtype, seed=0)
    rows: list[tuple] = []
    t_zero = time.perf_counter_ns()
    with (contextlib.nullcontext() if args.smoke else gpu_sampler(args.out / "smi.csv", 20)), \
            TorchEncoderRunner(model, max_batch=64, max_seq_len=SEQ_LEN, cuda_graphs=not args.smoke,
                               record_gpu_time=True) as runner:
        runner.host_input(64, SEQ_LEN)[:] = rng.integers(1000, model.cfg.vocab, size=(64, SEQ_LEN))
        for b in range(1, 65):
            runner.prepare(b, SEQ_LEN)

        def run(phase: str, b: int) -> None:
            runner.infer(b, SEQ_LEN)
            rows.append((phase, b, (runner.last_issue_ns - t_zero) / 1e9,
                         (runner.last_done_ns - runner.last_issue_ns) / 1e6, runner.last_gpu_ms))

        def for_s(seconds: float, phase: str, size) -> None:
            """Back-to-back batches for ``seconds``; the i-th has ``size(i)`` samples."""
            end = time.perf_counter() + seconds
            i = 0
            while time.perf_counter() < end:
                run(phase, size(i))
                i += 1

        def mix(i: int, drawn=[0]) -> int:
            """The profile's pattern: a random size, four batches in a row."""
            if i % 4 == 0:
                drawn[0] = int(rng.integers(1, 65))
            return drawn[0]

        for_s(phase_s / 2, "warm", lambda i: PROBE)
        for_s(phase_s, "mix", mix)
        for b in (8, 16, 32, 48, 64):
            for_s(phase_s, f"steady-{b}", lambda i, b=b: PROBE if i % 8 == 7 else b)
        for b in (32, 64, 8, 32):
            for_s(phase_s / 2, f"step-{b}", lambda i, b=b: b)
        time.sleep(1.0)
        for_s(phase_s / 2, "after-idle", lambda i: PROBE)
        for_s(phase_s, "mix-again", mix)
    with open(args.out / "batches.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["phase", "batch", "t_s", "host_ms", "gpu_ms"])
        w.writerows(rows)
    (args.out / "run.json").write_text(json.dumps({"cpu_pinning": pinning, "phase_s": phase_s, "model": name,
                                                   "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
                                                   "torch": torch.__version__}, indent=2, default=str))
    # A first look, printed: the batch-32 GPU time per phase.
    by: dict[str, list[float]] = {}
    for phase, b, _, _, g in rows:
        if b == PROBE:
            by.setdefault(phase, []).append(g)
    for phase, g in by.items():
        print(f"{phase:<12} batch-{PROBE} gpu ms median {np.median(g):.4f} (n={len(g)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
