"""Speed of the LLM simulator: simulated time over wall time ("x real time").

``paged-kv`` with current vLLM's defaults (prefix caching, async scheduling, whole-prompt
admission) on the Azure LLM 2023 conversation trace (../shared/traces) at its own rate,
4x and 10x (``--rate-scale``), with prefix caching off too at 1x and 10x, and on the
Mooncake conversation trace at its own rate; priced by the bundled H200 decoder step
profile. The whole ``schedsim run`` is timed as a subprocess (start-up, trace import,
simulation, summary), and ``simulate_llm`` alone in-process, in wall and CPU time (CPU
time is steadier on a shared machine). Where paged-kv's compiled replay covers a cell
(``path``), the same run in Python is timed once too. Target: at least 2,000x real time in
every cell.

    python benchmarks/bench_llm.py                 # every cell, one measurement each
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
TRACES = REPO.parent / "shared" / "traces"
AZURE_CONV = TRACES / "azure_llm_2023_conv.csv"
MOONCAKE = TRACES / "mooncake_conversation.jsonl"
CELLS = [(AZURE_CONV, 1.0, True), (AZURE_CONV, 4.0, True), (AZURE_CONV, 10.0, True), (MOONCAKE, 1.0, True),
         (AZURE_CONV, 1.0, False), (AZURE_CONV, 10.0, False)]
"""(trace, rate scale, prefix caching) of each cell; the defaults' cells first."""
TARGET_X_REAL_TIME = 2000.0


def one_cell(path: Path, rate_scale: float, prefix: bool, repeat: int) -> dict:
    from schedsim.cost.step_model import StepCostModel
    from schedsim.cost.step_profile import load_step_profile
    from schedsim.run.llm_runner import default_step_profile_path
    from schedsim.core.llm_simulate import simulate_llm
    from schedsim.registry import build_policy
    from schedsim.core.policy import Requests
    from schedsim.traces.io import load_trace, scale_rate

    trace = load_trace(path)
    if rate_scale != 1.0:
        trace = scale_rate(trace, rate_scale)
    span_s = float(trace.arrival_s[-1] - trace.arrival_s[0])
    req = Requests.from_trace(trace)
    cost = StepCostModel.from_profile(load_step_profile(default_step_profile_path()))
    params = {"enable_prefix_caching": prefix}
    from policies import paged_kv_compiled

    probe = build_policy("paged-kv", params)
    probe.reset(req)
    compiled = probe.COMPILED and paged_kv_compiled.numba is not None and paged_kv_compiled.covered(probe, cost)
    inproc, cpu, whole, loads = [], [], [], []
    for _ in range(repeat):
        policy = build_policy("paged-kv", params)
        t, c = time.perf_counter(), time.process_time()
        result = simulate_llm(req, policy, cost)
        inproc.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)   # steadier than wall time on a shared machine
        simulated_s = (int(result.step_end_ns.max()) - int(req.arrival_ns[0])) / 1e9
        cmd = [sys.executable, "-m", "schedsim.cli.main", "run", str(path), "--policy", "paged-kv",
               "--rate-scale", str(rate_scale), "--json"]
        if not prefix:
            cmd.append("--no-enable-prefix-caching")
        loads.append(os.getloadavg()[0])
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
        whole.append(time.perf_counter() - t)
    python_cpu = None
    if compiled:   # the same run in Python (PagedKV.COMPILED off), once, for the ratio in this run
        policy = build_policy("paged-kv", params)
        policy.COMPILED = False
        c = time.process_time()
        simulate_llm(req, policy, cost)
        python_cpu = time.process_time() - c
    return {"trace": path.name, "rate_scale": rate_scale, "prefix_caching": prefix, "requests": len(req),
            "trace_span_s": span_s, "simulated_s": simulated_s,
            "steps": int(result.step_repeats.sum()), "step_events": int(result.step_start_ns.size),
            "path": "compiled" if compiled else "python", "first_call_cpu_s": cpu[0],
            "python_cpu_s": python_cpu, "compiled_speedup_cpu": python_cpu / min(cpu) if python_cpu else None,
            "simulate_s": min(inproc), "simulate_cpu_s": min(cpu), "whole_run_s": min(whole),
            "x_real_time_simulate": simulated_s / min(inproc),
            "x_real_time_simulate_cpu": simulated_s / min(cpu),
            "x_real_time_whole_run": simulated_s / min(whole),
            "command": " ".join(cmd[1:]), "loadavg_before": loads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    for path, name in ((AZURE_CONV, "azure-conv"), (MOONCAKE, "mooncake")):
        if not path.exists():
            sys.exit(f"{path}: not found (schedsim trace download {name})")
    # A user's installed copy runs from cached bytecode; this machine sets
    # PYTHONDONTWRITEBYTECODE, so compile once, as a first run elsewhere would.
    import compileall

    for package in ("schedsim", "policies"):
        compileall.compile_dir(REPO / package, quiet=1)
    cells = [one_cell(path, scale, prefix, args.repeat) for path, scale, prefix in CELLS]
    out = {"cells": cells, "target_x_real_time": TARGET_X_REAL_TIME,
           "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                       "platform": platform.platform()},
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_llm.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'trace':<28} {'rate':>5} {'prefix':>6} {'path':>8} {'steps':>9} {'events':>7} {'simulate s':>10} "
          f"{'cpu s':>6} {'python cpu s':>12} {'whole s':>8} {'x real (sim)':>12} {'(sim cpu)':>9} "
          f"{'x real (whole)':>14} {'load':>10}")
    for c in cells:
        python = f"{c['python_cpu_s']:.2f}" if c["python_cpu_s"] is not None else "-"
        print(f"{c['trace']:<28} {c['rate_scale']:>5g} {str(c['prefix_caching']):>6} {c['path']:>8} {c['steps']:>9,} "
              f"{c['step_events']:>7,} {c['simulate_s']:>10.2f} {c['simulate_cpu_s']:>6.2f} {python:>12} "
              f"{c['whole_run_s']:>8.2f} {c['x_real_time_simulate']:>12,.0f} {c['x_real_time_simulate_cpu']:>9,.0f} "
              f"{c['x_real_time_whole_run']:>14,.0f} {min(c['loadavg_before']):>4.1f}-{max(c['loadavg_before']):<4.1f}")


if __name__ == "__main__":
    main()
