"""Speed and memory of a whole ``schedsim run`` against a bare simpy M/M/1.

The target: ``dynamic`` on a 2,000,000-request Poisson trace at 70% load, the whole
``schedsim run`` (a subprocess: startup, trace loading, simulation, summary) in at most
1.0 s and at least 20x the request rate of a bare simpy M/M/1 with one process per request
on the same arrivals, measured in the same run; ``--out`` adding at most 30% to it; and at
most 200 bytes of memory per request for every variant (``none``, ``static`` and
``--instances 2`` too).

    python benchmarks/bench_run.py              # the full benchmark (3 rounds, a few minutes)
    python benchmarks/bench_run.py --n 200000   # a quicker look

Each round runs every whole-run variant once and then bare simpy once (``--repeat``
rounds, ``--bare-repeat`` bare measurements), so drift in the shared machine's speed
falls on all alike, each round starting one variant later; the verdict compares medians,
and min and max are reported too.

Writes benchmarks/results/bench_run.json (every figure, the exact commands, machine
metadata) and, when the speed target is missed, a cProfile of the in-process simulate()
to benchmarks/results/bench_run_profile.txt. benchmarks/README.md explains the method.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"

SPEED_TARGET = 20.0          # schedsim requests/s over bare-simpy requests/s
WALL_TARGET_S = 1.0          # the whole run of csv_default, median
OUT_TARGET = 0.30            # what --out may add to the run (csv_out over csv_default, medians)
MEMORY_TARGET_B = 200.0      # bytes of peak RSS per request
SEQ_LEN = 128                # the bundled profile is measured at seq_len 128 only
POLICY_FLAGS = {
    "default": ["--policy", "dynamic", "--max-batch-size", "64", "--max-queue-delay-us", "1000"],
    "preferred": ["--policy", "dynamic", "--max-batch-size", "64", "--max-queue-delay-us", "1000",
                  "--preferred-batch-size", "8,16,32"],
    "none": ["--policy", "none"],
    "static": ["--policy", "static", "--batch-size", "8"],
    "instances2": ["--policy", "dynamic", "--max-batch-size", "64", "--max-queue-delay-us", "1000",
                   "--instances", "2"],
}
POLICY_PARAMS = {
    "default": {"max_batch_size": 64, "max_queue_delay_us": 1000},
    "preferred": {"max_batch_size": 64, "max_queue_delay_us": 1000, "preferred_batch_sizes": (8, 16, 32)},
}


# ------------------------------------------------------------------ machine and inputs

def machine_info() -> dict:
    import pandas
    import pyarrow
    import simpy

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {
        "cpu": cpu, "cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
        "mem_total_gib": mem_gib, "platform": platform.platform(), "python": platform.python_version(),
        "numpy": np.__version__, "simpy": simpy.__version__, "pandas": pandas.__version__,
        "pyarrow": pyarrow.__version__,
    }


def capacity(profile_path: Path) -> dict:
    """Best samples/s of the profile: max over batch b of b / (latency_ms_mean(b) + dispatch overhead)."""
    from schedsim.cost.profile import load_profile

    prof = load_profile(profile_path)
    table = prof.table
    overhead_ms = float(prof.meta.get("dispatch_overhead_us", 0.0)) / 1000
    batch = table["batch"].to_numpy()
    service_ms = table["latency_ms_mean"].to_numpy() + overhead_ms
    rate = batch / (service_ms / 1000)
    best = int(rate.argmax())
    return {"profile": str(profile_path), "dispatch_overhead_us": overhead_ms * 1000,
            "best_batch": int(batch[best]), "best_service_ms": float(service_ms[best]),
            "capacity_samples_per_s": float(rate[best]),
            "capacity_without_overhead_samples_per_s": float(batch[best] / (table["latency_ms_mean"].to_numpy()[best] / 1000)),
            "batch1_service_ms": float(service_ms[batch == 1][0]) if (batch == 1).any() else None}


def schedsim_exe() -> str:
    exe = Path(sys.executable).parent / "schedsim"
    return str(exe) if exe.exists() else (shutil.which("schedsim") or "schedsim")


# ------------------------------------------------------------------ subprocess measurement

# Runs one command per line of JSON on stdin and answers with its measurements. On Linux a
# child's peak RSS (ru_maxrss) starts at its parent's RSS when it was spawned (exec keeps
# the high-water mark of the image it replaces), so every measured child is spawned by this
# small process (a few MiB, whatever the benchmark itself holds): their figures are their own.
_SPAWNER = r"""
import json, os, subprocess, sys, time
for line in sys.stdin:
    job = json.loads(line)
    load_before = os.getloadavg()[0]
    with open(job["stdout"] or os.devnull, "wb") as out, open(job["stderr"], "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(job["cmd"], stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    print(json.dumps({"wall_s": wall, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
                      "maxrss_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB
                      "returncode": os.waitstatus_to_exitcode(status), "loadavg_1m_before": load_before,
                      "loadavg_1m_after": os.getloadavg()[0]}), flush=True)
"""


class Spawner:
    """The small process that spawns every measured child (see _SPAWNER)."""

    def __init__(self, workdir: Path):
        self.stderr = workdir / "child.stderr"
        self.proc = subprocess.Popen([sys.executable, "-c", _SPAWNER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def measure(self, cmd: list[str], *, stdout_path: Path | None = None) -> dict:
        """Run ``cmd``; wall time (spawn to exit) and that child's own peak RSS (os.wait4)."""
        job = {"cmd": cmd, "stdout": str(stdout_path) if stdout_path else None, "stderr": str(self.stderr)}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        r = json.loads(self.proc.stdout.readline())
        if r.pop("returncode") != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{self.stderr.read_text(errors='replace')[-4000:]}")
        return {"cmd": cmd, **r}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# The small trace of the memory baseline: large enough (about 480 kB) to be read by pyarrow, as
# the large trace is (a small plain CSV trace is read with the csv module, without pyarrow).
SMALL_N = 20_000

_PROBE = """
import json, sys
from schedsim.cli.main import main
rc = main(sys.argv[2:])
assert rc == 0, rc
json.dump(sorted(m for m in sys.modules if m not in ("__main__", "__mp_main__")), open(sys.argv[1], "w"))
"""

_BASELINE = """
import importlib, json, sys
for name in json.load(open(sys.argv[1])):
    try:
        importlib.import_module(name)
    except Exception:
        pass
"""


# ------------------------------------------------------------------ bare simpy M/M/1

def bare_simpy_mm1(arrival_s: np.ndarray, rho: float, seed: int) -> dict:
    """M/M/1 in plain simpy: a source process walks the arrivals and starts one process per request."""
    import simpy

    n = len(arrival_s)
    lam = n / float(arrival_s[-1])
    mean_service = rho / lam
    service = np.random.default_rng(seed).exponential(mean_service, n).tolist()
    arrivals = arrival_s.tolist()
    done = [0.0] * n

    def customer(env, server, i, s):
        with server.request() as req:
            yield req
            yield env.timeout(s)
        done[i] = env.now

    def source(env, server):
        for i, t in enumerate(arrivals):
            yield env.timeout(t - env.now)
            env.process(customer(env, server, i, service[i]))

    load_before = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    env = simpy.Environment()
    server = simpy.Resource(env, capacity=1)
    env.process(source(env, server))
    env.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    response = np.asarray(done) - arrival_s
    theory = 1.0 / (1.0 / mean_service - lam)
    return {"requests": n, "rho": rho, "arrival_rate_per_s": lam, "mean_service_s": mean_service,
            "wall_s": wall, "cpu_s": cpu, "requests_per_s": n / wall,
            "mean_response_s": float(response.mean()), "mm1_theory_mean_response_s": theory,
            "mean_response_rel_err": float(response.mean() / theory - 1),
            "loadavg_1m_before": load_before, "loadavg_1m_after": os.getloadavg()[0]}


def bare_in_child(spawner: Spawner, trace: Path, n: int, seed: int, stdout: Path) -> dict:
    """bare_simpy_mm1 in a child process of its own, like the runs it is compared with."""
    spawner.measure([sys.executable, __file__, "--bare-child", str(trace), "--bare-n", str(n), "--seed", str(seed)],
                    stdout_path=stdout)
    return json.loads(stdout.read_text())


# ------------------------------------------------------------------ in-process pieces

def as_schedsim_run() -> None:
    """This process's memory as ``schedsim run`` sets its own (schedsim.cli.main.prepare_run_process):
    freed blocks kept for reuse and numpy's arrays in ordinary pages, numpy being loaded already.
    Without them a 2,000,000-request summarize() took 0.25-0.32 s here the first time, mostly
    system time in page faults, where the command's takes about 0.06 s."""
    from schedsim.cli.main import prepare_run_process

    prepare_run_process()
    np._core.multiarray._set_madvise_hugepage(os.environ["NUMPY_MADVISE_HUGEPAGE"] != "0")


def in_process(csv: Path, parquet: Path, profile_path: Path, flags: list[str], seed: int,
               want_tracemalloc: bool) -> dict:
    """Time load / build / simulate / summarize as runner.execute does them, for a breakdown, in
    this process set up as ``schedsim run`` sets its own (:func:`as_schedsim_run`)."""
    as_schedsim_run()
    from schedsim.cost.model import CostModel
    from schedsim.core.metrics import summarize
    from schedsim.registry import build_policy
    from schedsim.core.policy import Requests
    from schedsim.cost.profile import load_profile
    from schedsim.core.simulate import simulate
    from schedsim.traces.io import load_trace

    out: dict = {"loadavg_1m_before": os.getloadavg()[0]}
    t = time.perf_counter()
    trace = load_trace(csv)
    out["load_csv_s"] = time.perf_counter() - t
    t = time.perf_counter()
    trace_pq = load_trace(parquet)
    out["load_parquet_s"] = time.perf_counter() - t
    assert np.array_equal(trace.arrival_s, trace_pq.arrival_s), "CSV and Parquet traces differ"
    del trace_pq
    t = time.perf_counter()
    requests = Requests.from_trace(trace)
    cost = CostModel.from_profile(load_profile(profile_path))
    out["build_s"] = time.perf_counter() - t
    out["variants"] = {}
    for name in flags:
        policy = build_policy("dynamic", dict(POLICY_PARAMS[name]))
        t = time.perf_counter()
        result = simulate(requests, policy, cost, instances=1, seed=seed)
        sim_s = time.perf_counter() - t
        t = time.perf_counter()
        summary = summarize(result)
        sum_s = time.perf_counter() - t
        out["variants"][name] = {"simulate_s": sim_s, "summarize_s": sum_s,
                                 "simulate_requests_per_s": len(requests) / sim_s,
                                 "batches": int(result.batch_start_ns.size),
                                 "completed": summary["completed"],
                                 "mean_batch_size": summary["mean_batch_size"],
                                 "p99_ms": summary["p99_ms"], "utilization": summary["utilization"]}
        del result
    if want_tracemalloc:
        policy = build_policy("dynamic", dict(POLICY_PARAMS["default"]))
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        result = simulate(requests, policy, cost, instances=1, seed=seed)
        peak = tracemalloc.get_traced_memory()[1] - base
        kept = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        del result
        out["tracemalloc_simulate"] = {
            "variant": "default", "peak_bytes": peak, "peak_bytes_per_request": peak / len(requests),
            "result_bytes": kept, "result_bytes_per_request": kept / len(requests),
            "note": "allocations during simulate() only; the trace and Requests columns already existed"}
    out["loadavg_1m_after"] = os.getloadavg()[0]
    return out


def profile_simulate(csv: Path, profile_path: Path, seed: int, dest: Path, top: int = 30) -> dict:
    """cProfile of simulate() for the default flags; writes the top functions to ``dest``."""
    from schedsim.cost.model import CostModel
    from schedsim.registry import build_policy
    from schedsim.core.policy import Requests
    from schedsim.cost.profile import load_profile
    from schedsim.core.simulate import simulate
    from schedsim.traces.io import load_trace

    requests = Requests.from_trace(load_trace(csv))
    cost = CostModel.from_profile(load_profile(profile_path))
    policy = build_policy("dynamic", dict(POLICY_PARAMS["default"]))
    prof = cProfile.Profile()
    prof.enable()
    simulate(requests, policy, cost, instances=1, seed=seed)
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).strip_dirs()
    text.write(f"cProfile of simulate() on {len(requests):,} requests, flags {POLICY_FLAGS['default']}\n")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    dest.write_text(text.getvalue())
    events = sum(v[1] for k, v in stats.stats.items() if k[0] == "core.py" and k[2] == "step")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:12]
    return {"file": str(dest), "events_processed": events,
            "events_per_request": events / len(requests), "total_tt_s": stats.total_tt,
            "top_tottime": [{"function": f"{k[0]}:{k[1]}({k[2]})", "ncalls": v[1], "tottime_s": v[2],
                             "cumtime_s": v[3]} for k, v in rows]}


# ------------------------------------------------------------------ repeated measurements

VARIANTS = (("csv_default", "csv", "default"), ("csv_preferred", "csv", "preferred"),
            ("parquet_default", "parquet", "default"), ("csv_out", "csv", "default"),
            ("csv_out_parquet", "csv", "default"), ("csv_none", "csv", "none"), ("csv_static", "csv", "static"),
            ("csv_instances2", "csv", "instances2"))
SPEED_VARIANTS = ("csv_default", "csv_preferred", "parquet_default")  # against bare simpy
OUT_FLAGS = {"csv_out": ["--format", "csv"], "csv_out_parquet": ["--format", "parquet"]}


def whole_run(spawner: Spawner, exe: str, trace: Path, label: str, flags: str, n: int, stdout: Path,
              baseline_rss: int, small_rss: int) -> dict:
    """One ``schedsim run`` subprocess: wall time, rate, memory; checks every request completed."""
    out = [] if label not in OUT_FLAGS else ["--out", str(stdout.with_suffix(".out")), "--overwrite", *OUT_FLAGS[label]]
    r = spawner.measure([exe, "run", str(trace), *POLICY_FLAGS[flags], *out, "--json"], stdout_path=stdout)
    summary = json.loads(stdout.read_text())
    if summary["completed"] != n:
        raise RuntimeError(f"{trace} {flags}: completed {summary['completed']} of {n}")
    r["requests_per_s"] = n / r["wall_s"]
    r["rss_minus_baseline_bytes"] = r["maxrss_bytes"] - baseline_rss
    r["bytes_per_request"] = r["rss_minus_baseline_bytes"] / n
    r["marginal_bytes_per_request"] = (r["maxrss_bytes"] - small_rss) / (n - SMALL_N)
    r["summary"] = {k: summary[k] for k in ("completed", "throughput_rps", "mean_batch_size", "p50_ms",
                                            "p99_ms", "mean_ms", "batches", "utilization")}
    return r


def spread(runs: list[dict], n: int) -> dict:
    """Min, median and max wall time of repeated runs, and the rates and memory they give."""
    walls = [r["wall_s"] for r in runs]
    mem = [r["bytes_per_request"] for r in runs]
    cpu = [r["user_s"] + r["sys_s"] for r in runs]
    return {"repeats": len(runs), "wall_s_min": min(walls), "wall_s_median": statistics.median(walls),
            "cpu_s_median": statistics.median(cpu),
            "wall_s_max": max(walls), "requests_per_s_median": n / statistics.median(walls),
            "requests_per_s_best": n / min(walls), "bytes_per_request_median": statistics.median(mem),
            "bytes_per_request_max": max(mem), "cmd": runs[0]["cmd"], "runs": runs}


# ------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2_000_000, help="requests in the trace")
    ap.add_argument("--load", type=float, default=0.7, help="fraction of the profile's capacity")
    ap.add_argument("--seed", type=int, default=1, help="seed of the trace and of the runs")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds: each runs every whole-run variant once, then bare simpy once")
    ap.add_argument("--bare-repeat", type=int, default=None,
                    help="bare simpy measurements (default: --repeat), one per round")
    ap.add_argument("--bare-n", type=int, default=None,
                    help="time bare simpy on this prefix of the trace (default: all of it)")
    ap.add_argument("--no-profile", action="store_true", help="skip cProfile even if the target is missed")
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_run.json")
    ap.add_argument("--keep", type=Path, default=None, help="keep the traces in this directory")
    ap.add_argument("--bare-child", type=Path, default=None, help=argparse.SUPPRESS)  # see bare_in_child
    args = ap.parse_args(argv)
    if args.bare_child is not None:
        from schedsim.traces.io import load_trace

        arrivals = load_trace(args.bare_child).arrival_s[:args.bare_n]
        print(json.dumps(bare_simpy_mm1(arrivals, rho=0.7, seed=args.seed)))
        return 0
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    bare_repeat = args.repeat if args.bare_repeat is None else args.bare_repeat
    if bare_repeat < 1:
        ap.error("--bare-repeat must be >= 1")

    from schedsim.cost.profile import default_profile_path

    args.out.parent.mkdir(parents=True, exist_ok=True)
    # A user's installed copy runs from cached bytecode; this machine sets
    # PYTHONDONTWRITEBYTECODE, so compile once, as a first run elsewhere would.
    import compileall

    for package in ("schedsim", "policies"):
        compileall.compile_dir(REPO / package, quiet=1)
    exe = schedsim_exe()
    profile_path = default_profile_path()
    cap = capacity(profile_path)
    rate = args.load * cap["capacity_samples_per_s"]
    report: dict = {"benchmark": "bench_run", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "machine": machine_info(), "requests": args.n, "load": args.load, "seed": args.seed,
                    "repeat": args.repeat, "bare_repeat": bare_repeat,
                    "capacity": cap, "arrival_rate_per_s": rate, "targets": {
                        "speed_ratio_min": SPEED_TARGET, "wall_s_max": WALL_TARGET_S, "out_added_max": OUT_TARGET,
                        "bytes_per_request_max": MEMORY_TARGET_B}}
    print(f"capacity {cap['capacity_samples_per_s']:,.1f} samples/s (batch {cap['best_batch']}, "
          f"{cap['best_service_ms']:.4f} ms incl. {cap['dispatch_overhead_us']:.1f} us dispatch); "
          f"trace rate {args.load:.0%} = {rate:,.3f} req/s", flush=True)

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="schedsim-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    spawner = Spawner(tmp)
    try:
        traces = {"csv": tmp / "poisson.csv", "parquet": tmp / "poisson.parquet"}
        small = tmp / "small.csv"
        gen = [exe, "trace", "gen", "--seed", str(args.seed), "--arrival", "poisson", "--rate", f"{rate:.6f}",
               "--seq-len", f"fixed:{SEQ_LEN}"]
        report["trace_gen"] = {
            "csv": spawner.measure(gen + ["--n", str(args.n), "--out", str(traces["csv"])]),
            "parquet": spawner.measure(gen + ["--n", str(args.n), "--out", str(traces["parquet"])]),
            "small": spawner.measure(gen + ["--n", str(SMALL_N), "--out", str(small)]),
            "csv_bytes": traces["csv"].stat().st_size, "parquet_bytes": traces["parquet"].stat().st_size}
        print(f"traces: {traces['csv'].stat().st_size / 1e6:.1f} MB CSV, "
              f"{traces['parquet'].stat().st_size / 1e6:.1f} MB Parquet in {tmp}", flush=True)

        # Memory baseline: a process importing exactly what `schedsim run` imports, doing nothing.
        mods = tmp / "modules.json"
        spawner.measure([sys.executable, "-c", _PROBE, str(mods), "run", str(small), *POLICY_FLAGS["default"],
                       "--json"])
        baseline = spawner.measure([sys.executable, "-c", _BASELINE, str(mods)])
        baseline["modules"] = len(json.loads(mods.read_text()))
        small_run = spawner.measure([exe, "run", str(small), *POLICY_FLAGS["default"], "--json"])
        report["memory_baseline"] = {"imports_only": baseline, "run_small": small_run, "small_requests": SMALL_N}
        print(f"baseline: imports only {baseline['wall_s']:.2f} s, {baseline['maxrss_bytes'] / 2**20:.0f} MiB; "
              f"run on {SMALL_N:,} requests {small_run['wall_s']:.2f} s, {small_run['maxrss_bytes'] / 2**20:.0f} MiB",
              flush=True)

        bare_n = min(args.bare_n or args.n, args.n)
        # Rounds: every variant once, then bare simpy, so that drift in the machine's speed
        # falls on all of them alike; medians, not single runs, make the verdict. Each round
        # starts one variant later, so that the run right after bare simpy (a long process
        # holding 2,000,000 simpy processes) is not always the same one.
        runs: dict[str, list] = {label: [] for label, _, _ in VARIANTS}
        bare_runs = []
        for round_ in range(max(args.repeat, bare_repeat)):
            first = round_ % len(VARIANTS)
            for label, kind, flags in VARIANTS[first:] + VARIANTS[:first] if round_ < args.repeat else ():
                r = whole_run(spawner, exe, traces[kind], label, flags, args.n, tmp / f"{label}.json",
                              baseline["maxrss_bytes"], small_run["maxrss_bytes"])
                runs[label].append(r)
                print(f"round {round_ + 1}: schedsim run {label}: {r['wall_s']:.2f} s, "
                      f"{r['requests_per_s']:,.0f} req/s, peak RSS {r['maxrss_bytes'] / 2**20:.0f} MiB "
                      f"({r['bytes_per_request']:.0f} B/request)", flush=True)
            if round_ < bare_repeat:
                bare = bare_in_child(spawner, traces["csv"], bare_n, args.seed, tmp / "bare.json")
                bare_runs.append(bare)
                print(f"round {round_ + 1}: bare simpy M/M/1: {bare_n:,} requests in {bare['wall_s']:.2f} s, "
                      f"{bare['requests_per_s']:,.0f} req/s (mean response {bare['mean_response_rel_err']:+.1%} "
                      "vs theory)", flush=True)
        report["schedsim_run"] = {label: spread(rs, args.n) for label, rs in runs.items()}
        bare_walls = [b["wall_s"] for b in bare_runs]
        report["bare_simpy_mm1"] = {
            "command": "a child process; only env.run() timed: see bare_simpy_mm1() in benchmarks/bench_run.py",
            "requests": bare_n,
            "repeats": len(bare_runs), "wall_s_min": min(bare_walls), "wall_s_median": statistics.median(bare_walls),
            "wall_s_max": max(bare_walls), "requests_per_s_median": bare_n / statistics.median(bare_walls),
            "cpu_s_median": statistics.median(b["cpu_s"] for b in bare_runs),
            "runs": bare_runs}

        report["in_process"] = in_process(traces["csv"], traces["parquet"], profile_path, list(POLICY_PARAMS),
                                          args.seed, True)
        ip = report["in_process"]
        print("in-process: " + ", ".join(f"{k} {v:.2f} s" for k, v in ip.items() if k.endswith("_s")) + ", "
              + ", ".join(f"{name} simulate {x['simulate_s']:.2f} s + summarize {x['summarize_s']:.2f} s"
                          for name, x in ip["variants"].items()), flush=True)

        report["verdict"] = verdict(report)
        report["warnings"] = warnings(report)
        if report["verdict"]["speed"] == "FAIL" and not args.no_profile:
            print("speed target missed: profiling simulate() ...", flush=True)
            report["profile"] = profile_simulate(traces["csv"], profile_path, args.seed,
                                                 args.out.parent / "bench_run_profile.txt")
    finally:
        spawner.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=float) + "\n")
    print_table(report)
    print(f"wrote {args.out}")
    return 0


def verdict(report: dict) -> dict:
    """Speed from medians (each variant's median wall time against bare simpy's median rate);
    memory from the largest figure of any run."""
    bare_rate = report["bare_simpy_mm1"]["requests_per_s_median"]
    runs = report["schedsim_run"]
    ratios = {label: r["requests_per_s_median"] / bare_rate for label, r in runs.items()}
    best = {label: r["requests_per_s_best"] / bare_rate for label, r in runs.items()}
    ratios["simulate_only_default"] = report["in_process"]["variants"]["default"]["simulate_requests_per_s"] / bare_rate
    worst_ratio = min(ratios[k] for k in SPEED_VARIANTS)
    worst_bytes = max(r["bytes_per_request_max"] for r in runs.values())
    wall = runs["csv_default"]["wall_s_median"]
    out_added = {k: runs[k]["wall_s_median"] / wall - 1 for k in OUT_FLAGS}
    # On a shared machine CPU time (user + system, all threads) moves less with other load than
    # wall time does; the same ratios by CPU time, for reading a loaded run.
    bare_cpu_rate = report["bare_simpy_mm1"]["requests"] / report["bare_simpy_mm1"]["cpu_s_median"]
    n = report["requests"]
    by_cpu = {"speed_ratio": {k: n / runs[k]["cpu_s_median"] / bare_cpu_rate for k in SPEED_VARIANTS},
              "cpu_s_csv_default_median": runs["csv_default"]["cpu_s_median"],
              "out_added": {k: runs[k]["cpu_s_median"] / runs["csv_default"]["cpu_s_median"] - 1 for k in OUT_FLAGS}}
    return {"speed_ratio": ratios, "speed_ratio_fastest_run": best, "speed_ratio_worst_whole_run": worst_ratio,
            "speed": "PASS" if worst_ratio >= SPEED_TARGET else "FAIL",
            "wall_s_csv_default_median": wall, "wall": "PASS" if wall <= WALL_TARGET_S else "FAIL",
            "out_added": out_added, "out": "PASS" if out_added["csv_out"] <= OUT_TARGET else "FAIL",
            "by_cpu_time": by_cpu,
            "bytes_per_request": {k: r["bytes_per_request_max"] for k, r in runs.items()},
            "bytes_per_request_worst": worst_bytes,
            "memory": "PASS" if worst_bytes <= MEMORY_TARGET_B else "FAIL"}


def warnings(report: dict) -> list[str]:
    """Load from other work, and the spread of repeated runs, as pyperf would report them."""
    out = []
    measured = [r for v in report["schedsim_run"].values() for r in v["runs"]] + report["bare_simpy_mm1"]["runs"]
    busy = max(v for r in measured for v in (r["loadavg_1m_before"], r["loadavg_1m_after"]))
    if busy > 0.75 * (os.cpu_count() or 1):
        out.append(f"1-minute load average reached {busy:.2f} on {os.cpu_count()} CPUs: other work shared "
                   "the machine; timings may be inflated")
    for label, v in [*report["schedsim_run"].items(), ("bare simpy", report["bare_simpy_mm1"])]:
        if v["repeats"] > 1 and v["wall_s_max"] > 1.2 * v["wall_s_min"]:
            out.append(f"{label}: wall time varied from {v['wall_s_min']:.2f} to {v['wall_s_max']:.2f} s "
                       f"over {v['repeats']} runs")
    if min(v["repeats"] for v in (*report["schedsim_run"].values(), report["bare_simpy_mm1"])) < 3:
        out.append("fewer than 3 repeats: a median of so few runs is still noisy")
    return out


def print_table(report: dict) -> None:
    bare = report["bare_simpy_mm1"]
    v = report["verdict"]
    print(f"\n{'what':42} {'wall s min':>10} {'median':>8} {'max':>7} {'req/s (median)':>15} "
          f"{'x bare':>7} {'B/req':>6}")
    rows = [("bare simpy M/M/1 (process per request)", bare, None, None)]
    rows += [(f"schedsim run, {label}", r, v["speed_ratio"][label], r["bytes_per_request_max"])
             for label, r in report["schedsim_run"].items()]
    for name, r, ratio, b in rows:
        print(f"{name:42} {r['wall_s_min']:10.2f} {r['wall_s_median']:8.2f} {r['wall_s_max']:7.2f} "
              f"{r['requests_per_s_median']:15,.0f} {'' if ratio is None else f'{ratio:7.2f}':>7} "
              f"{'' if b is None else f'{b:6.0f}':>6}")
    sim = report["in_process"]["variants"]["default"]
    print(f"{'simulate() only, default (one run)':42} {sim['simulate_s']:10.2f} {'':>8} {'':>7} "
          f"{sim['simulate_requests_per_s']:15,.0f} {v['speed_ratio']['simulate_only_default']:7.2f}")
    print(f"speed (>= {SPEED_TARGET:g}x bare simpy, whole run, medians of {report['repeat']} runs against "
          f"{bare['repeats']}, {', '.join(SPEED_VARIANTS)}): {v['speed']}; memory (<= {MEMORY_TARGET_B:g} B/request, "
          f"largest): {v['memory']}")
    print(f"whole run csv_default <= {WALL_TARGET_S:g} s (median): {v['wall_s_csv_default_median']:.2f} s {v['wall']}; "
          f"--out adds (<= {OUT_TARGET:.0%}): " + ", ".join(f"{k} {x:+.0%}" for k, x in v["out_added"].items())
          + f" {v['out']}")
    c = v["by_cpu_time"]
    print("by CPU time (user + system): x bare " + ", ".join(f"{k} {x:.1f}" for k, x in c["speed_ratio"].items())
          + f"; csv_default {c['cpu_s_csv_default_median']:.2f} s; --out adds "
          + ", ".join(f"{k} {x:+.0%}" for k, x in c["out_added"].items()))
    for w in report["warnings"]:
        print(f"warning: {w}")


if __name__ == "__main__":
    sys.exit(main())
