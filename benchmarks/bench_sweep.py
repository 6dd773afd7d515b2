"""Speed of ``schedsim sweep``: 100 cells over a 100,000-request trace, local processes
against Ray, on this machine.

    python benchmarks/bench_sweep.py              # about 2 minutes on 2 cores
    python benchmarks/bench_sweep.py --cells 20   # a quicker look
    python benchmarks/bench_sweep.py --requests 1000000 --cells 20 --rounds 3 --no-ray   # serial and local in turn

Each executor runs the same sweep (in-process ``run_sweep``, as ``schedsim sweep`` does,
without plots) and the ranked outputs are compared byte for byte. Ray is started locally
with ``num_cpus`` = the core count; its start-up is timed separately. One serial run
(``--workers 1``, no pool) gives the baseline. Writes benchmarks/results/bench_sweep.json.

``--rounds N`` runs serial and local N times each, in turn (serial, local, serial, ...), so
that load from other work that rises or falls during the benchmark falls on both alike; the
figure is then the ratio of their median wall times, with each round's own ratio, the
1-minute load average around each run and the CPU time of the calling process and of its
(joined) workers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PREFERRED = "none,8/16/32,4/8/16/32/64,16/32,8/16"   # 5 values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=100, help="a multiple of 5 (default 100)")
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="serial and local this many times each, in turn")
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_sweep.json")
    args = ap.parse_args()

    from schedsim.cli.main import prepare_run_process

    prepare_run_process()  # as `schedsim sweep` sets itself up, before numpy and pyarrow load
    from schedsim.planning.grid import parse_grid
    from schedsim.planning.objective import parse_objective, parse_slo
    from schedsim.run.runner import RunSpec
    from schedsim.planning.sweep import SweepSpec, run_sweep

    delays = args.cells // 5
    grid_items = [f"max_queue_delay_us=0:{250 * (delays - 1)}:250", f"preferred_batch_size={PREFERRED}"]
    cores = os.cpu_count()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    trace = tmp / "trace.csv"
    gen = ["trace", "gen", "--arrival", "poisson", "--rate", "8000", "--n", str(args.requests),
           "--seed", "1", "--seq-len", "fixed:128", "--out", str(trace)]
    subprocess.run([sys.executable, "-m", "schedsim.cli.main", *gen], check=True, stdout=subprocess.DEVNULL)
    slo = parse_slo([], p99_ms=3.0)
    spec = SweepSpec(base=RunSpec(trace=trace, seed=1), grid=parse_grid(grid_items), slo=slo,
                     objective=parse_objective("max:throughput_rps", 0.01, slo), plot=False)
    figures: dict = {"cells": args.cells, "requests": args.requests, "cores": cores,
                     "trace": "schedsim " + " ".join(gen[:-2]), "grid": grid_items, "slo": "p99_ms<=3",
                     "runs": {}}

    def timed(name: str, **changes) -> dict:
        out = tmp / name
        load0 = os.getloadavg()[0]
        own0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        run_sweep(SweepSpec(**{**vars(spec), **changes, "out": out}))
        wall = time.perf_counter() - t0
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        run = {"wall_s": wall, "cells_per_s": args.cells / wall,
               "cpu_s_caller": own.ru_utime + own.ru_stime - own0.ru_utime - own0.ru_stime,
               "cpu_s_workers": max(0.0, kids.ru_utime + kids.ru_stime - kids0.ru_utime - kids0.ru_stime),
               "load_before": load0, "load_after": os.getloadavg()[0]}
        figures["runs"][name] = run
        print(f"{name:>16}: {wall:7.2f} s, {args.cells / wall:6.2f} cells/s, CPU {run['cpu_s_caller']:.2f} s "
              f"+ workers {run['cpu_s_workers']:.2f} s, load {load0:.2f} -> {run['load_after']:.2f}", flush=True)
        return run

    rounds = []
    for r in range(max(1, args.rounds)):
        suffix = "" if r == 0 else f" {r + 1}"
        rounds.append((timed("serial" + suffix, workers=1), timed("local" + suffix, executor="local", workers=cores)))
    walls = [(s["wall_s"], loc["wall_s"]) for s, loc in rounds]
    figures["local_over_serial"] = statistics.median(s for s, _ in walls) / statistics.median(x for _, x in walls)
    figures["local_over_serial_by_round"] = [s / x for s, x in walls]
    print(f"{'local / serial':>16}: {figures['local_over_serial']:7.2f}x (medians of {len(rounds)}; rounds: "
          + ", ".join(f"{s / x:.2f}x" for s, x in walls) + ")", flush=True)
    if not args.no_ray:
        import ray

        t0 = time.perf_counter()
        ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 configure_logging=False)
        figures["ray_start_s"] = time.perf_counter() - t0
        print(f"{'ray.init':>16}: {figures['ray_start_s']:7.2f} s", flush=True)
        timed("ray", executor="ray", workers=cores)
        timed("ray (warm)", executor="ray", workers=cores)
        figures["ray_version"] = ray.__version__
        ray.shutdown()
    same = {name: (tmp / name / "sweep.csv").read_bytes() == (tmp / "serial" / "sweep.csv").read_bytes()
            and (tmp / name / "best.json").read_bytes() == (tmp / "serial" / "best.json").read_bytes()
            for name in figures["runs"]}
    figures["same_bytes_as_serial"] = same
    print("same sweep.csv and best.json as serial:", same)
    figures["machine"] = {"cpu": _cpu(), "python": platform.python_version(), "platform": platform.platform()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {args.out}")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
