"""Measure the default cost profile: bert-base, fp16, seq_len 128, every batch 1..64.

Per batch size the timed work is what a serving loop does per batch: H2D copy of the
input ids from a pinned host buffer, CUDA-graph replay, D2H copy of the pooled output,
synchronize; timed on the host (launch to synchronize), with warm-up and interleaved
rounds (see schedsim.profiling.measure). CUDA events around the replay give the GPU time. A
separate loop measures the host dispatch gap between batches (not part of latency).

Writes NAME.csv, NAME.json and NAME.samples.npz (schedsim.profile/1) into --out.
Imports only numpy, torch, schedsim.live.engines.torch_encoder, schedsim.profiling.measure and
schedsim.profiling.host, so it runs on an image without the simulator's other dependencies.
``--cpu N`` (or auto) pins the process to one CPU first (schedsim/profiling/host.py), recorded as
the sidecar's machine.cpu_pinning.

    PYTHONPATH=. python3 experiments/default_profile/measure.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from schedsim.live.engines.torch_encoder import DESCRIPTIONS, CONFIGS, TorchEncoderRunner, build_encoder
from schedsim.errors import InputError
from schedsim.profiling.host import pin_cpu
from schedsim.profiling.measure import gpu_state, interleaved, machine_metadata, summarize

CSV_COLUMNS = ["batch", "seq_len", "latency_ms_mean", "latency_ms_p50", "latency_ms_p90",
               "latency_ms_p99", "latency_ms_std", "n", "latency_ms_min", "latency_ms_max",
               "gpu_ms_mean"]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TIMING = ("host launch-to-synchronize per batch: H2D copy of input ids, graph replay, "
          "D2H copy of output, synchronize")


def parse_batches(text: str) -> list[int]:
    """'1-64' or '1,2,4,8' or '1-8,16' -> sorted unique batch sizes."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def dispatch_gaps_us(runner: TorchEncoderRunner, seq_len: int, batches: list[int],
                     iters: int, rng: np.random.Generator) -> np.ndarray:
    """Host gap between one batch's synchronize returning and the next batch's H2D issue.

    The loop is what a serving loop does between batches: pick the next requests, stack
    their per-request id arrays into the pinned staging buffer with numpy, launch.
    """
    vocab = runner.model.cfg.vocab
    n_req = 4096
    requests = [rng.integers(1000, vocab, size=seq_len, dtype=np.int64) for _ in range(n_req)]
    sizes = rng.choice(np.asarray(batches), size=iters)
    issue = np.empty(iters, dtype=np.int64)
    done = np.empty(iters, dtype=np.int64)
    pos = 0
    for i, b in enumerate(sizes.tolist()):
        buf = runner.host_input(b, seq_len)
        np.stack(requests[pos:pos + b], out=buf)
        pos = (pos + b) % (n_req - max(batches))
        runner.infer(b, seq_len, buf)
        issue[i] = runner.last_issue_ns
        done[i] = runner.last_done_ns
    return (issue[1:] - done[:-1]) * 1e-3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out"), help="output folder")
    ap.add_argument("--name", default="bert-base-fp16-cg-h200", help="file name stem")
    ap.add_argument("--model", default="bert-base", choices=sorted(CONFIGS))
    ap.add_argument("--precision", default="fp16", choices=sorted(DTYPES))
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batches", default="1-64", help="e.g. 1-64 or 1,2,4,8")
    ap.add_argument("--no-cuda-graphs", action="store_true", help="run eagerly")
    ap.add_argument("--warmup-ms", type=float, default=200.0, help="warm-up per cell")
    ap.add_argument("--min-iters", type=int, default=400, help="samples per cell, at least")
    ap.add_argument("--min-time-s", type=float, default=1.0, help="timed seconds per cell, mean")
    ap.add_argument("--per-visit", type=int, default=4, help="samples per cell per round")
    ap.add_argument("--max-time-s", type=float, default=300.0, help="cap on the sampling phase")
    ap.add_argument("--dispatch-iters", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", default=None, help="pin to this CPU first: a number or auto (default: not pinned)")
    args = ap.parse_args(argv)
    try:
        pinning = pin_cpu(args.cpu)  # before CUDA starts its threads (they inherit the CPU set)
    except InputError as exc:
        ap.error(str(exc))
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    command = shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = parse_batches(args.batches)
    s = args.seq_len
    rng = np.random.default_rng(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp16 runs unaffected; fp32 runs honest
    print(f"command: {command}", flush=True)

    gpu_before = gpu_state()
    t0 = time.perf_counter()
    model = build_encoder(args.model, args.device, DTYPES[args.precision], seed=args.seed)
    print(f"built {args.model} on {args.device} in {time.perf_counter() - t0:.1f} s", flush=True)

    with TorchEncoderRunner(model, max_batch=max(batches), max_seq_len=s,
                            cuda_graphs=not args.no_cuda_graphs,
                            record_gpu_time=True) as runner:
        t0 = time.perf_counter()
        # Valid random ids in the whole staging buffer; every shape reads a prefix of it.
        runner.host_input(max(batches), s)[:] = rng.integers(
            1000, model.cfg.vocab, size=(max(batches), s))
        for b in batches:
            runner.prepare(b, s)
        print(f"prepared {len(batches)} shapes ({len(runner.graph_shapes)} as CUDA graphs) "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)

        gpu_ms: dict[int, list[float]] = {b: [] for b in batches}
        cells = {b: (lambda b=b: runner.infer(b, s)) for b in batches}
        t0 = time.perf_counter()
        res = interleaved(cells, rng, warmup_s=args.warmup_ms / 1e3, min_iters=args.min_iters,
                          min_time_s=args.min_time_s, per_visit=args.per_visit,
                          max_time_s=args.max_time_s,
                          after=lambda b: gpu_ms[b].append(runner.last_gpu_ms))
        print(f"sampled {len(res.order)} batches in {res.rounds} rounds, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        gaps = dispatch_gaps_us(runner, s, batches, args.dispatch_iters, rng)
        graphs_all = len(runner.graph_shapes) == len(batches)
        runner_warnings = list(runner.warnings)

    machine = machine_metadata(gpu_before) | {"cpu_pinning": pinning}
    rows, warnings = [], []
    by_cell = res.by_cell()
    for b in batches:
        st = summarize(by_cell[b])
        row = {k: st[k] for k in CSV_COLUMNS if k in st}
        g = np.asarray(gpu_ms[b], dtype=np.float64)
        g = g[np.isfinite(g)]
        row.update(batch=b, seq_len=s, gpu_ms_mean=float(g.mean()) if g.size else float("nan"))
        rows.append(row)
        if st["unstable"]:
            warnings.append(f"batch={b} seq_len={s} unstable: {st['unstable_reason']}")
    if res.truncated:
        warnings.append(f"sampling stopped at --max-time-s={args.max_time_s} before the targets")
    warnings += runner_warnings + machine["warnings"]

    with open(out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([r[c] if c in ("batch", "seq_len", "n") else f"{r[c]:.6f}"
                        for c in CSV_COLUMNS])
    np.savez_compressed(out / f"{args.name}.samples.npz",
                        batch=np.asarray(res.order, dtype=np.int32),
                        seq_len=np.full(len(res.order), s, dtype=np.int32),
                        latency_ms=res.latency_ms.astype(np.float32))
    sidecar = {
        "schema": "schedsim.profile/1",
        "model": DESCRIPTIONS[args.model],
        "backend": "torch",
        "backend_version": torch.__version__,
        "precision": args.precision,
        "cuda_graphs": graphs_all and not args.no_cuda_graphs and args.device.startswith("cuda"),
        "device": machine.get("gpu", "cpu") if args.device.startswith("cuda") else "cpu",
        "driver": machine.get("driver"),
        "cuda": torch.version.cuda,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "timing": TIMING,
        "dispatch_overhead_us": float(gaps.mean()),
        "samples": f"{args.name}.samples.npz",
        "warmup_ms": args.warmup_ms,
        "min_iters": args.min_iters,
        "min_time_s": args.min_time_s,
        "machine": machine,
        "warnings": warnings,
    }
    (out / f"{args.name}.json").write_text(json.dumps(sidecar, indent=2) + "\n")

    print(f"\n{'batch':>5} {'n':>5} {'mean_ms':>9} {'p50_ms':>9} {'p99_ms':>9} "
          f"{'std/mean':>8} {'max/min':>7} {'gpu_ms':>8} {'samples/s':>10}")
    for r in rows:
        print(f"{r['batch']:5d} {r['n']:5d} {r['latency_ms_mean']:9.4f} {r['latency_ms_p50']:9.4f} "
              f"{r['latency_ms_p99']:9.4f} {r['latency_ms_std'] / r['latency_ms_mean']:8.3f} "
              f"{r['latency_ms_max'] / r['latency_ms_min']:7.2f} {r['gpu_ms_mean']:8.4f} "
              f"{r['batch'] / r['latency_ms_mean'] * 1e3:10.0f}")
    print(f"\ndispatch gap (us): mean {gaps.mean():.1f}  p50 {np.percentile(gaps, 50):.1f}  "
          f"p99 {np.percentile(gaps, 99):.1f}  max {gaps.max():.1f}  (n={gaps.size})")
    print(f"warm-up calls per cell: min {min(res.warmup_calls.values())}, "
          f"max {max(res.warmup_calls.values())}")
    print("warnings:" + ("".join(f"\n  - {w}" for w in warnings) or " none"))
    print(f"wrote {out}/{args.name}.{{csv,json,samples.npz}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
