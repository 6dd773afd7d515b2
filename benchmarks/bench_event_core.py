"""The event core: schedsim's own heap loop against simpy's public API, on whole simulations.

Both loops run the same driver code (schedsim/core/simulate.py), which asks its loop for
``now``, ``peek()``, ``run()`` and ``at(time, priority, callback, value)``:

- ``own``: :class:`schedsim.core.events.EventLoop`, a heapq of (time, priority, sequence
  number, event) with slotted events;
- ``simpy``: a ``simpy.Environment`` whose ``at`` builds a ``simpy.Event`` and schedules it
  with ``Environment.schedule(event, priority, delay)``; ``run``, ``peek`` and ``now`` are
  simpy's own. simpy processes only triggered events, and its public ways to trigger one
  (``Timeout``, ``Event.succeed``) fix the priority, so this event sets ``_ok`` and
  ``_value`` as ``simpy.Timeout`` does: the least the public API allows.

Cases: ``dynamic`` (max batch 64, queue delay 1 ms) on a Poisson trace at 70% of the
bundled profile's capacity, with one instance (most events run inline: the heap holds
about two) and with two instances at the same load per instance (completions go through
the heap); and a 4-replica fleet (round robin), where every event goes through the heap.
Each round runs every (case, loop) pair once, loops alternating, so drift in the shared
machine's speed falls on both; ratios are of medians within this run. Results are checked
to be identical between the loops.

    python benchmarks/bench_event_core.py                 # 2,000,000 requests, 3 rounds
    python benchmarks/bench_event_core.py --n 200000      # a quicker look

Writes benchmarks/results/bench_event_core.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import simpy

from policies import DynamicBatcher
from schedsim.core.events import EventLoop
from schedsim.core.policy import Requests
from schedsim.core.simulate import _Driver
from schedsim.cost.model import CostModel
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.planning.fleet import simulate_fleet
from schedsim.registry import load_router
from schedsim.traces.generate import poisson
from schedsim.traces.table import Trace
import schedsim.planning.fleet as fleet_module

RESULTS = Path(__file__).resolve().parent / "results"
LOAD = 0.7
SEQ_LEN = 128


class _SimpyEvent(simpy.Event):
    """A triggered simpy event with ``at`` and ``value`` (as simpy.Timeout initialises one)."""

    def __init__(self, env, at, callback, value):
        self.env = env
        self.callbacks = [callback]
        self._ok = True
        self._value = value
        self.at = at


class SimpyLoop(simpy.Environment):
    """simpy's Environment with the driver's ``at``, through ``Environment.schedule``."""

    def at(self, time_ns, priority, callback, value=None):
        event = _SimpyEvent(self, time_ns, callback, value)
        self.schedule(event, priority, time_ns - self.now)
        return event


LOOPS = {"own": EventLoop, "simpy": SimpyLoop}


def capacity(cost: CostModel) -> float:
    """Best samples/s over measured batch sizes (mean plus dispatch overhead)."""
    return max(b / cost.mean_s(b, SEQ_LEN) for b in cost.batches.tolist())


def run_case(case: str, loop: str, requests: Requests, cost: CostModel, seed: int):
    policy = lambda: DynamicBatcher(max_batch_size=64, max_queue_delay_us=1000)  # noqa: E731
    make = LOOPS[loop]
    if case.startswith("fleet"):
        # The fleet builds its own loop: point it at the one measured.
        fleet_module.EventLoop = make
        try:
            t = time.perf_counter()
            result = simulate_fleet(requests, policy, cost, replicas=4, instances=1, seed=seed,
                                    router=load_router("round-robin"))
            return time.perf_counter() - t, result.result
        finally:
            fleet_module.EventLoop = EventLoop
    instances = 2 if case.endswith("2 instances") else 1
    driver = _Driver(requests, policy(), cost, instances, seed, False, make())
    driver.runs_inline = True    # as simulate() runs it (an env passed in turns inlining off)
    t = time.perf_counter()
    result = driver.run()
    return time.perf_counter() - t, result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2_000_000, help="requests per trace")
    ap.add_argument("--repeat", type=int, default=3, help="rounds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", default="dynamic, 1 instance;dynamic, 2 instances;fleet of 4, round robin")
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_event_core.json")
    args = ap.parse_args(argv)

    cost = CostModel.from_profile(load_profile(default_profile_path()))
    cap = capacity(cost)
    cases = [c.strip() for c in args.cases.split(";") if c.strip()]
    traces = {}
    for case in cases:
        servers = 4 if case.startswith("fleet") else (2 if case.endswith("2 instances") else 1)
        arrivals = poisson(LOAD * cap * servers, rng=np.random.default_rng(args.seed), n=args.n)
        traces[case] = Requests.from_trace(Trace.from_arrivals(arrivals, seq_len=np.full(args.n, SEQ_LEN)))

    for loop in LOOPS:   # warm-up: imports, caches and the cost model's entries
        run_case(cases[0], loop, traces[cases[0]].head(min(args.n, 20_000)), cost, args.seed)
    times: dict = {c: {loop: [] for loop in LOOPS} for c in cases}
    reference: dict = {}
    for r in range(args.repeat):
        order = list(LOOPS) if r % 2 == 0 else list(reversed(LOOPS))
        for case in cases:
            for loop in order:
                wall, result = run_case(case, loop, traces[case], cost, args.seed)
                times[case][loop].append(wall)
                key = (result.end_ns.tobytes(), result.batch_start_ns.tobytes())
                if reference.setdefault(case, key) != key:
                    raise SystemExit(f"{case}: the {loop} loop gave a different result")
                print(f"round {r + 1} {case:28s} {loop:6s} {wall:7.3f} s", flush=True)

    report = {"n": args.n, "repeat": args.repeat, "load": LOAD, "seed": args.seed,
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version(), "numpy": np.__version__,
                          "simpy": simpy.__version__},
              "loadavg_1m_end": os.getloadavg()[0], "cases": {}}
    print(f"\n{'case':28s} {'own s (min/med/max)':>24s} {'simpy s (min/med/max)':>24s} {'simpy/own':>10s}")
    for case in cases:
        row = {loop: {"wall_s": times[case][loop], "median_s": statistics.median(times[case][loop])}
               for loop in LOOPS}
        row["simpy_over_own"] = row["simpy"]["median_s"] / row["own"]["median_s"]
        report["cases"][case] = row
        fmt = lambda v: "/".join(f"{x:.2f}" for x in (min(v), statistics.median(v), max(v)))  # noqa: E731
        print(f"{case:28s} {fmt(times[case]['own']):>24s} {fmt(times[case]['simpy']):>24s} "
              f"{row['simpy_over_own']:>10.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
