"""Three and four instances on one GPU: how much does each batch slow beside the others?

The pair grid (``schedsim profile --instances 2 --pair-s``) says how a batch slows beside
one other instance's batch, by both sizes. With more instances the simulator has no grid
and falls back to the per-count tables; this measures what a rule built from the pair
grid would have to reproduce. It runs K CUDA-graph runners of bert-base (fp16, seq_len
128), one thread each (schedsim.profiling.measure.sample_concurrent, as the profiler's multi-instance
cells), for every multiset of sizes below, plus each size alone and a few pairs (to check
the pair grid in the same call), and writes each side's median host latency (device;
about a minute):

    PYTHONPATH=. python3 experiments/fidelity/diagnose_multi_contention.py --out "$OUT/multi.json"

``--rules FILE`` (here) compares rules built from the committed pair grid with what FILE
measured for every batch of three and four instances:

    python experiments/fidelity/diagnose_multi_contention.py --rules experiments/fidelity/calibration/multi_contention.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schedsim.profiling.host import live_cpu_count, pin_cpu  # noqa: E402
from schedsim.profiling.measure import sample_cell, sample_concurrent  # noqa: E402

SEQ_LEN = 128
SIZES = (1, 8, 32, 64)
PAIRS = [(64, 1), (32, 32), (8, 8), (64, 8)]
TRIPLES = list(itertools.combinations_with_replacement(SIZES, 3))
QUADS = [(1, 1, 1, 1), (8, 8, 8, 8), (32, 32, 32, 32), (64, 64, 64, 64), (64, 1, 1, 1), (1, 64, 64, 64),
         (32, 8, 8, 1), (64, 32, 8, 1)]


def compare_rules(path: Path) -> None:
    """Print each rule's error against the measured slowdowns of batches beside two or three others."""
    from schedsim.core.contention import PairSlowdown
    from schedsim.cost.profile import load_profile

    root = Path(__file__).resolve().parents[2]
    grid = PairSlowdown.from_meta(load_profile(root / "profiles" / "bert-base-fp16-cg-2inst-h200.csv").meta, "grid")
    last, before = grid.batch[-1], grid.batch[-2]

    def linear_beyond(b, other):
        if other <= last:
            return grid.slowdown(b, other)
        z, a = grid.slowdown(b, last), grid.slowdown(b, before)
        return z + (other - last) * (z - a) / (last - before)
    rules = {"1 + sum of the pairwise excesses": lambda b, others: 1 + sum(grid.slowdown(b, c) - 1 for c in others),
             "the grid at the summed size, linear beyond": lambda b, others: linear_beyond(b, sum(others)),
             "the grid at the summed size, flat beyond": lambda b, others: grid.slowdown(b, sum(others)),
             "the product of the pairwise slowdowns": lambda b, others: float(np.prod([grid.slowdown(b, c) for c in others]))}
    data = json.loads(path.read_text())
    alone = {int(k): v for k, v in data["alone"].items()}
    sides = [(len(c["sizes"]), b, c["sizes"][:i] + c["sizes"][i + 1:], ms / alone[b])
             for c in data["combos"] if len(c["sizes"]) >= 3 for i, (b, ms) in enumerate(zip(c["sizes"], c["median_ms"]))]
    k = np.array([s[0] for s in sides])
    print(f"{len(sides)} batches of three and four instances")
    for name, rule in rules.items():
        err = np.abs([(rule(b, others) / measured - 1) * 100 for _, b, others, measured in sides])
        print(f"{name:45s} median {np.median(err):5.1f}%  worst {err.max():6.1f}%  "
              f"3 instances {np.median(err[k == 3]):5.1f}%  4 instances {np.median(err[k == 4]):5.1f}%")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rules", type=Path, help="compare rules against this measurement instead (no GPU)")
    ap.add_argument("--time-s", type=float, default=0.4, help="timed seconds per combination")
    ap.add_argument("--smoke", action="store_true", help="CPU check: bert-tiny, eager, two triples")
    args = ap.parse_args(argv)
    if args.rules:
        compare_rules(args.rules)
        return 0
    if args.out is None:
        ap.error("--out is required (or --rules FILE)")
    pinning = pin_cpu("auto", count=live_cpu_count(4))

    import torch

    from schedsim.live.engines.torch_encoder import TorchEncoderRunner, build_encoder

    device, name, dtype = ("cpu", "bert-tiny", torch.float32) if args.smoke else ("cuda", "bert-base", torch.float16)
    model = build_encoder(name, device, dtype, seed=0)
    kw = dict(max_batch=64, max_seq_len=SEQ_LEN, cuda_graphs=not args.smoke, record_gpu_time=True)
    combos = PAIRS + TRIPLES + QUADS
    if args.smoke:
        combos = [(8, 1), (8, 1, 1), (1, 1, 1, 1)]
    out = {"alone": {}, "combos": [], "cpu_pinning": pinning, "model": name, "time_s": args.time_s}
    with contextlib.ExitStack() as stack:
        runners = [stack.enter_context(TorchEncoderRunner(model, **kw)) for _ in range(4)]
        for r in runners:
            for b in SIZES:
                r.prepare(b, SEQ_LEN)
        common = dict(warmup_s=0.05, min_iters=20, min_time_s=args.time_s)
        one = runners[0]
        for b in SIZES:
            res = sample_cell(lambda b=b: one.infer(b, SEQ_LEN), **common)
            out["alone"][str(b)] = float(np.median(res.latency_ms))
        for combo in combos:
            fns = [lambda r=r, b=b: r.infer(b, SEQ_LEN) for r, b in zip(runners, combo)]
            res = sample_concurrent(fns, **common)
            lat = np.asarray(res.latency_ms)
            sides = [float(np.median(lat[res.instance == i])) for i in range(len(combo))]
            out["combos"].append({"sizes": list(combo), "median_ms": sides})
            print(" ".join(f"{b}:{ms:.3f}({ms / out['alone'][str(b)]:.2f}x)" for b, ms in zip(combo, sides)), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
