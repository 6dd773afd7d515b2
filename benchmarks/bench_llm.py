"""Speed of the LLM simulator: simulated time over wall time (the issue's "x real time").

``paged-kv`` on the Azure LLM 2023 conversation trace (../shared/traces), at its own
rate and at 10x, with prefix caching off and on, priced by the bundled H200 decoder step
profile. The whole ``schedsim run`` is timed as a subprocess (start-up, trace import,
simulation, summary), and ``simulate_llm`` alone in-process. Target: at least 2,000x
real time at the trace's own rate.

    python benchmarks/bench_llm.py                 # all four cells, one measurement each
    python benchmarks/bench_llm.py --repeat 3      # best of 3 per cell

Writes benchmarks/results/bench_llm.json with every figure, the commands and the load
average around each measurement (the machine is shared; see README).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRACE = REPO.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
TARGET_X_REAL_TIME = 2000.0


def one_cell(rate_scale: float, prefix: bool, repeat: int) -> dict:
    from schedsim.cost.step_model import StepCostModel
    from schedsim.cost.step_profile import load_step_profile
    from schedsim.run.llm_runner import default_step_profile_path
    from schedsim.core.llm_simulate import simulate_llm
    from schedsim.registry import build_policy
    from schedsim.core.policy import Requests
    from schedsim.traces.io import load_trace, scale_rate

    trace = load_trace(TRACE)
    if rate_scale != 1.0:
        trace = scale_rate(trace, rate_scale)
    span_s = float(trace.arrival_s[-1] - trace.arrival_s[0])
    req = Requests.from_trace(trace)
    cost = StepCostModel.from_profile(load_step_profile(default_step_profile_path()))
    params = {"enable_prefix_caching": prefix}
    inproc, cpu, whole = [], [], []
    for _ in range(repeat):
        policy = build_policy("paged-kv", params)
        t, c = time.perf_counter(), time.process_time()
        result = simulate_llm(req, policy, cost)
        inproc.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)   # steadier than wall time on a shared machine
        simulated_s = (int(result.step_end_ns.max()) - int(req.arrival_ns[0])) / 1e9
        cmd = [sys.executable, "-m", "schedsim.cli.main", "run", str(TRACE), "--policy", "paged-kv",
               "--rate-scale", str(rate_scale), "--json"]
        if prefix:
            cmd.append("--enable-prefix-caching")
        load_before = os.getloadavg()[0]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
        whole.append(time.perf_counter() - t)
    return {"rate_scale": rate_scale, "prefix_caching": prefix, "requests": len(req),
            "trace_span_s": span_s, "simulated_s": simulated_s,
            "steps": int(result.step_repeats.sum()), "step_events": int(result.step_start_ns.size),
            "simulate_s": min(inproc), "simulate_cpu_s": min(cpu), "whole_run_s": min(whole),
            "x_real_time_simulate": simulated_s / min(inproc),
            "x_real_time_whole_run": simulated_s / min(whole),
            "command": " ".join(cmd[1:]), "loadavg_before": load_before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if not TRACE.exists():
        sys.exit(f"{TRACE}: not found (schedsim trace download azure-conv)")
    # A user's installed copy runs from cached bytecode; this machine sets
    # PYTHONDONTWRITEBYTECODE, so compile once, as a first run elsewhere would.
    import compileall

    for package in ("schedsim", "policies"):
        compileall.compile_dir(REPO / package, quiet=1)
    cells = [one_cell(scale, prefix, args.repeat) for scale in (1.0, 10.0) for prefix in (False, True)]
    out = {"cells": cells, "target_x_real_time": TARGET_X_REAL_TIME,
           "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                       "platform": platform.platform()},
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_llm.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'rate':>5} {'prefix':>6} {'steps':>9} {'events':>7} {'simulate s':>10} {'cpu s':>6} {'whole s':>8} "
          f"{'x real (sim)':>12} {'x real (whole)':>14}")
    for c in cells:
        print(f"{c['rate_scale']:>5g} {str(c['prefix_caching']):>6} {c['steps']:>9,} {c['step_events']:>7,} "
              f"{c['simulate_s']:>10.2f} {c['simulate_cpu_s']:>6.2f} {c['whole_run_s']:>8.2f} "
              f"{c['x_real_time_simulate']:>12,.0f} {c['x_real_time_whole_run']:>14,.0f}")


if __name__ == "__main__":
    main()
