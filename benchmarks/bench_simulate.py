"""``simulate()`` against its floor: a plain-Python loop of the same batcher with the same draws.

The floor (:func:`floor`) is what one would write by hand for this one case and nothing
else: Triton's dynamic batcher with its default preferred size (= max batch size) and a
queue delay, one instance, one sample of one shape per request, arrival times as one
Python list, and the same cost model (``CostModel.sample_s`` on the same block-drawn
uniforms), the same wake-up cost and the same power-capped clock. It must give the same
batch log as ``simulate()``, bit for bit (checked every round), so the ratio compares two
ways of computing one answer.

    python benchmarks/bench_simulate.py                  # 2,000,000 requests, 5 rounds
    python benchmarks/bench_simulate.py --n 200000       # a quicker look

``simulate()`` runs this case compiled where the C extension is built
(``schedsim.core.compiled_queue``); the Python loop it replaces is timed too
(``simulate_python``, with ``compiled_queue.ENABLED = False``).

Rounds alternate the three; the figures are ratios of medians within one run
(``results/bench_simulate.json``). Target: ``simulate()``, and its Python loop alone, within
1.3x of the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from bisect import bisect_right
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from policies.dynamic import DynamicBatcher  # noqa: E402
from schedsim.core import compiled_queue  # noqa: E402
from schedsim.core.policy import NEVER, Requests  # noqa: E402
from schedsim.core.simulate import _uniforms, simulate  # noqa: E402
from schedsim.cost.model import CostModel  # noqa: E402
from schedsim.cost.power import GpuClock  # noqa: E402
from schedsim.cost.profile import default_profile_path, load_profile  # noqa: E402
from schedsim.traces.generate import poisson  # noqa: E402

RATE = 12213.357359   # 70% of the default profile's capacity (benchmarks/README.md, bench_run.py)
SEQ_LEN = 128


def requests(n: int, seed: int = 1) -> Requests:
    arrival_ns = np.rint(poisson(RATE, rng=np.random.default_rng(seed), n=n) * 1e9).astype(np.int64)
    ones, zeros = np.ones(n, np.int32), np.zeros(n, np.int32)
    return Requests(arrival_ns, ones, np.full(n, SEQ_LEN, np.int32), np.zeros(n, np.int16),
                    np.zeros(n, np.int64), zeros, zeros)


def floor(arrivals: list[int], cost: CostModel, max_batch: int, delay_ns: int, seed: int) -> list:
    """The dynamic batcher (preferred size = max_batch) on one instance, by hand; its batch log.
    ``arrivals``: arrival times in ns as a Python list (made before the clock starts)."""
    n = len(arrivals)
    rng = np.random.default_rng(seed)
    draw = _uniforms(rng)
    wake_draw = _uniforms(np.random.default_rng([seed, 1])).random if cost.wake_is_random else (lambda: 0.5)
    clock = GpuClock(cost.power_cap) if cost.power_cap is not None else None
    log = []
    head = tail = 0
    freed = -1
    now = arrivals[0]
    while True:
        tail = bisect_right(arrivals, now, tail)
        queued = tail - head
        if queued >= max_batch or (queued and now - arrivals[head] >= delay_ns):
            take = min(queued, max_batch)
            service_s = cost.sample_s(take, SEQ_LEN, draw)
            if clock is not None:
                factor = clock.launch(now, take)
                if factor != 1.0:
                    d = cost.dispatch_s(take)
                    service_s = d + (service_s - d) * factor
            service_ns = int(round(service_s * 1e9))
            if freed != now:
                service_ns += cost.wake_ns(now - freed, wake_draw())
            end = now + service_ns
            if clock is not None:
                clock.ran(end)
            log.append((now, end, take))
            head += take
            freed = now = end
            continue
        # Wait for the queue delay of the oldest, or the arrival that fills a batch.
        nxt = arrivals[head] + delay_ns if queued else NEVER
        if tail < n:
            nxt = min(nxt, arrivals[min(head + max_batch, n) - 1])
        if nxt == NEVER:
            return log
        now = nxt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--max-queue-delay-us", type=int, default=1000)
    args = ap.parse_args(argv)
    req = requests(args.n)
    cost = CostModel.from_profile(load_profile(default_profile_path()))
    arrivals = req.arrival_ns.tolist()
    times = {"simulate": [], "simulate_python": [], "floor": []}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for name, compiled in (("simulate", True), ("simulate_python", False)):
            compiled_queue.ENABLED = compiled
            policy = DynamicBatcher(args.max_batch_size, max_queue_delay_us=args.max_queue_delay_us)
            t0 = time.perf_counter()
            result = simulate(req, policy, cost, seed=args.seed)
            times[name].append(time.perf_counter() - t0)
            compiled_queue.ENABLED = True
        t0 = time.perf_counter()
        log = floor(arrivals, cost, args.max_batch_size, args.max_queue_delay_us * 1000, args.seed)
        times["floor"].append(time.perf_counter() - t0)
        expected = np.array(log, dtype=np.int64).reshape(-1, 3)
        got = np.stack([result.batch_start_ns, result.batch_end_ns, result.batch_requests], axis=1)
        if not np.array_equal(expected, got):
            raise SystemExit("the floor's batch log differs from simulate()'s")
        load.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    report = {"n": args.n, "batches": len(log), "rounds": args.rounds, "times_s": times,
              "median_s": med, "ratio_simulate_over_floor": med["simulate"] / med["floor"],
              "ratio_simulate_python_over_floor": med["simulate_python"] / med["floor"],
              "compiled_loop_built": compiled_queue.available(),
              "loadavg_1m": load, "python": sys.version.split()[0], "numpy": np.__version__}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_simulate.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.n:,} requests, {len(log):,} batches, {args.rounds} rounds (load {load[0]:.1f} -> {load[-1]:.1f})")
    for k, v in times.items():
        print(f"  {k:9s} median {med[k]:.3f} s  (min {min(v):.3f}, max {max(v):.3f})")
    print(f"  simulate() / floor: {report['ratio_simulate_over_floor']:.2f}x (target <= 1.3x)"
          + ("" if compiled_queue.available() else "; the compiled loop is not built here"))
    print(f"  simulate() in Python alone / floor: {report['ratio_simulate_python_over_floor']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
