"""What two instances cost the simulator: one instance, two with the equal-size contention
table at launch, and two sharing the GPU by the pair grid (schedsim.core.contention), on the same
trace, in one run.

The pair grid re-times the other instance's running batch at every launch and completion,
so each batch costs a re-time and usually one extra simpy event (the stale completion is
popped and ignored); the equal-size table costs neither. Figures are ratios of medians
within one run (a shared machine's speed drifts between runs), written to
results/bench_instances.json.

    python benchmarks/bench_instances.py                # 500,000 requests, 3 rounds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schedsim.cost.model import CostModel  # noqa: E402
from schedsim.registry import build_policy  # noqa: E402
from schedsim.core.policy import Requests  # noqa: E402
from schedsim.cost.profile import default_profile_path, load_profile  # noqa: E402
from schedsim.core.simulate import simulate  # noqa: E402
from schedsim.traces.table import Trace  # noqa: E402
from schedsim.traces.generate import poisson  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DUO = ROOT / "profiles" / "bert-base-fp16-cg-2inst-h200.csv"
POLICY = {"max_batch_size": 64, "max_queue_delay_us": 100}


def variants() -> dict:
    base = load_profile(default_profile_path())
    duo = load_profile(DUO)
    flat = dataclasses.replace(duo, meta={k: v for k, v in duo.meta.items() if k != "pair_slowdown"})

    def cost(contention):
        c = CostModel.from_profile(base)
        if contention is not None:
            c.with_contention({2: CostModel.from_profile(contention, wake_overhead_s=0.0)})
        return c
    return {"1 instance": (1, cost(None)), "2 instances, equal-size table": (2, cost(flat)),
            "2 instances, pair grid": (2, cost(duo))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500_000)
    ap.add_argument("--rate", type=float, default=12_000.0, help="requests/s (about 70% of one GPU)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_instances.json")
    args = ap.parse_args(argv)
    arrivals = poisson(args.rate, rng=np.random.default_rng(1), n=args.n)
    requests = Requests.from_trace(Trace.from_arrivals(arrivals, seq_len=np.full(args.n, 128)))
    runs: dict = {name: [] for name in variants()}
    facts: dict = {}
    for _ in range(args.repeat):
        for name, (instances, cost) in variants().items():   # interleaved: drift hits all alike
            t = time.perf_counter()
            r = simulate(requests, build_policy("dynamic", dict(POLICY)), cost, instances=instances, seed=1)
            runs[name].append(time.perf_counter() - t)
            facts[name] = {"batches": int(r.batch_start_ns.size),
                           "p99_ms": float(np.percentile((r.end_ns - requests.arrival_ns) / 1e6, 99))}
    base = statistics.median(runs["1 instance"])
    out = {"command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]), "n": args.n,
           "rate_rps": args.rate, "policy": POLICY, "python": platform.python_version(),
           "variants": {name: {"wall_s": times, "wall_s_median": statistics.median(times),
                               "x_one_instance": statistics.median(times) / base,
                               "requests_per_s_median": args.n / statistics.median(times), **facts[name]}
                        for name, times in runs.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'variant':32s} {'wall s (median)':>16s} {'x 1 instance':>13s} {'req/s':>12s} {'batches':>9s} {'p99 ms':>7s}")
    for name, v in out["variants"].items():
        print(f"{name:32s} {v['wall_s_median']:16.2f} {v['x_one_instance']:13.2f} "
              f"{v['requests_per_s_median']:12,.0f} {v['batches']:9,d} {v['p99_ms']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
