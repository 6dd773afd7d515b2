"""The Triton fidelity grid's device half: a real tritonserver serving bert-base (fp16, one
CUDA graph per batch size, Python backend, KIND_GPU) on the H200, driven open loop.

Grid (CONFIGS x ARRIVALS x --loads, each cell --reps times):
- configs: no batching (policy none); dynamic with max_queue_delay 0, 100, 500, 2000 us,
  without and with preferred sizes [8, 16, 32] (max_batch_size 64); 1 and 2 instances;
- arrivals: Poisson, and gamma with CV 3;
- loads: fractions of this configuration's capacity (default 0.1, 0.3, 0.5, 0.7, 0.9).

Per configuration and replication a fresh server starts; it serves every (arrival, load)
cell of that configuration, each cell driven by ``schedsim live --backend triton
--triton-url`` (schedsim.triton.live) with Triton's statistics read before and after it.
The capacity is measured once per configuration, on the first replication's server: the
throughput of a burst of requests far larger than one batch (all sent within 50 ms), so
every replication replays the same traces (seeded by configuration, arrival and load).

Writes OUT/triton_grid_PART.jsonl (one line per cell run: settings, trace seed and rate,
the summary's figures, Triton's statistics difference, client lateness) and
OUT/run_info_PART.json (capacities, server start times, machine, failures). Rerunning
into the same OUT skips runs already there. --budget-s stops starting servers or cells
before the device's 10-minute limit.

Set-up on the device (no registry there; carry .triton, made here by
``python -m schedsim.triton.bundle pack .triton/triton-py3.12.tar.xz --python 3.12`` and
``pip download`` of tritonclient and python-rapidjson for Python 3.12 into .triton/wheels):

    python3 -m pip install --quiet --no-index --no-deps --target /tmp/wh .triton/wheels/*.whl
    export PYTHONPATH=/tmp/wh:$PWD PYTHONUNBUFFERED=1 SCHEDSIM_TRITON_HOME=$PWD/.triton/triton-py3.12.tar.xz
    python3 experiments/triton/run_h200.py --part 1/6 --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from schedsim.errors import InputError  # noqa: E402
from schedsim.files import json_safe  # noqa: E402
from schedsim.run.runner import RunSpec  # noqa: E402
from schedsim.traces.generate import generate  # noqa: E402
from schedsim.traces.io import save_trace  # noqa: E402
from schedsim.triton.client import drive  # noqa: E402
from schedsim.triton.live import TritonLiveSpec, execute_live_triton  # noqa: E402
from schedsim.triton.profiling import set_model_trace  # noqa: E402
from schedsim.triton.repository import model_config, write_repository  # noqa: E402
from schedsim.triton.server import TritonServer, find_tritonserver  # noqa: E402

MODEL, SEQ_LEN, MAX_BATCH, PREFERRED = "bert-base", 128, 64, (8, 16, 32)
NAME = "bert_base"
ON_CPU = {"model": "bert-tiny", "engine": "numpy", "kind": "KIND_CPU", "hidden": 128, "seq_len": 16,
          "max_batch": 16, "preferred": (4, 8)}
"""--cpu: the same grid with bert-tiny in numpy on KIND_CPU (max batch 16, preferred 4 and 8): the
CPU fidelity table, and a check of this script off the GPU."""
ARRIVALS = {"poisson": None, "gamma3": 3.0}


def configs(cpu: bool = False) -> list[dict]:
    max_batch, preferred = (ON_CPU["max_batch"], ON_CPU["preferred"]) if cpu else (MAX_BATCH, PREFERRED)
    out = [{"name": f"none-i{i}", "policy": "none", "params": {}, "instances": i} for i in (1, 2)]
    for i in (1, 2):
        for delay in (0, 100, 500, 2000):
            for pref in (False, True):
                params = {"max_batch_size": max_batch, "max_queue_delay_us": delay}
                if pref:
                    params["preferred_batch_sizes"] = list(preferred)
                out.append({"name": f"dyn-d{delay}-{'pref' if pref else 'nopref'}-i{i}", "policy": "dynamic",
                            "params": params, "instances": i})
    return out


def _seed(*parts) -> int:
    """A trace seed per cell, the same in every replication and every call."""
    return zlib.crc32(" ".join(map(str, parts)).encode())


def log_dir(work: Path, cfg: dict, rep: int) -> Path:
    """Where the server's model writes its execution log (schedsim.triton.execution_log)."""
    return work / f"{cfg['name']}-rep{rep}" / "executions"


def start_server(cfg: dict, work: Path, rep: int, cpu: bool) -> TritonServer:
    params = {"model": MODEL, "engine": "torch", "precision": "fp16", "cuda_graphs": 1, "seq_lens": str(SEQ_LEN),
              "seed": 0}
    kind, hidden = "KIND_GPU", 768
    if cpu:
        params |= {"model": ON_CPU["model"], "engine": ON_CPU["engine"], "seq_lens": str(ON_CPU["seq_len"])}
        kind, hidden = ON_CPU["kind"], ON_CPU["hidden"]
    repo = work / f"{cfg['name']}-rep{rep}" / "repo"
    mc = model_config(NAME, policy=cfg["policy"], params=cfg["params"], instances=cfg["instances"], kind=kind,
                      max_batch_size=1, hidden=hidden, parameters=params | {"execution_log": str(log_dir(work, cfg, rep))})
    write_repository(repo, NAME, mc)
    # Tracing off server-wide; each cell turns it on for its model at --trace-rate.
    args = ("--trace-config", f"triton,file={repo.parent / 'trace.json'}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"rate={2**31 - 1}", "--trace-config", "triton,log-frequency=0")
    env = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")} if cpu else {}
    return TritonServer(repo, repo.parent / "tritonserver.log", find_tritonserver(), args=args, env=env,
                        ready_timeout_s=240)


def server_side(trace_path: Path, windows: dict) -> dict:
    """Per cell, Triton's own REQUEST_START -> REQUEST_END of the traced requests that started
    inside the cell's measured window (after its warm-up): n, mean and percentiles in ms."""
    try:
        entries = json.loads(trace_path.read_text() or "[]")
    except (OSError, ValueError):
        return {}
    stamps: dict = {}
    for e in entries:
        rec = stamps.setdefault(e.get("id"), {})
        for t in e.get("timestamps", []):
            rec.setdefault(t["name"], int(t["ns"]))
    out = {}
    for key, (lo, hi) in windows.items():
        ms = np.array([(st["REQUEST_END"] - st["REQUEST_START"]) / 1e6 for st in stamps.values()
                       if "REQUEST_START" in st and "REQUEST_END" in st and lo <= st["REQUEST_START"] <= hi])
        if ms.size:
            out[key] = {"n": int(ms.size), "mean_ms": float(ms.mean()),
                        **{f"p{q}_ms": float(np.percentile(ms, q)) for q in (50, 90, 99)}}
    return out


def capacity_rps(url: str, requests: int, seq_len: int) -> float:
    """Throughput of ``requests`` sent within 50 ms: what the server sustains at full batches."""
    arrival = np.linspace(0, 50e6, requests).astype(np.int64)
    rec = drive(url, NAME, arrival, np.full(requests, seq_len, np.int64), processes=4, warmup=8)
    ok = rec.http_status == 200
    if ok.sum() < requests * 0.9:
        raise RuntimeError(f"capacity probe: {int((~ok).sum())} of {requests} requests failed "
                           f"({next((e for e in rec.error if e), '')})")
    return float(ok.sum() / ((rec.answered_ns[ok].max() - rec.sent_ns[ok].min()) / 1e9))


REQUEST_COLUMNS = ("scheduled_s", "sent_s", "answered_s", "model_start_s", "model_end_s", "model_batch_requests")


def keep_requests(csv: Path, dest: Path) -> None:
    """The cell's per-request times (client and execution log) as a compressed npz: what
    ``analyze.py --arrivals sent`` replays and what the per-execution comparison reads."""
    import pandas as pd

    df = pd.read_csv(csv, usecols=lambda c: c in REQUEST_COLUMNS + ("model_instance",))
    dest.parent.mkdir(parents=True, exist_ok=True)
    cols = {c: df[c].to_numpy() for c in REQUEST_COLUMNS if c in df}
    if "model_instance" in df:
        names, cols["model_instance"] = np.unique(df["model_instance"].fillna("").astype(str), return_inverse=True)
        cols["model_instance_names"] = names.astype(str)
    np.savez_compressed(dest, **cols)


def run_cell(cfg: dict, url: str, arrival: str, load: float, capacity: float, rep: int, args, work: Path) -> dict:
    seq_len = ON_CPU["seq_len"] if args.cpu else SEQ_LEN
    rate = load * capacity
    seed = _seed(cfg["name"], arrival, load)
    duration = max(args.duration_s, min(args.min_requests / rate, args.max_duration_s))
    cv = ARRIVALS[arrival]
    trace = generate("gamma" if cv else "poisson", rng=np.random.default_rng(seed), duration_s=duration,
                     rate=rate, cv=cv, seq_len=f"fixed:{seq_len}")
    cell_dir = work / f"{cfg['name']}-{arrival}-{load:g}-rep{rep}"
    cell_dir.mkdir(parents=True, exist_ok=True)
    save_trace(trace, cell_dir / "trace.csv")
    run = RunSpec(trace=cell_dir / "trace.csv", policy=cfg["policy"], params=dict(cfg["params"]),
                  instances=cfg["instances"], warmup_s=args.warmup_s, out=cell_dir / "live")
    processes = max(1, min(8, math.ceil(rate / 1000)))
    t = time.monotonic()
    if args.trace_rate:
        set_model_trace(url, NAME, args.trace_rate, timeout_s=30)
    window_ns = time.monotonic_ns() + int(args.warmup_s * 1e9)
    _, summary, _ = execute_live_triton(TritonLiveSpec(run=run, url=url, model_name=NAME, processes=processes,
                                                       seq_len=seq_len, execution_log=log_dir(work, cfg, rep)))
    window = (window_ns, time.monotonic_ns())
    if args.trace_rate:
        set_model_trace(url, NAME, None, timeout_s=30)
    stats = json.loads((cell_dir / "live" / "triton_stats.json").read_text())
    if args.keep_requests:
        keep_requests(cell_dir / "live" / "triton_requests.csv",
                      args.out / "requests" / f"{cfg['name']}-{arrival}-{load:g}-rep{rep}.npz")
    keep = ("requests", "completed", "failed", "rejected", "unfinished", "throughput_rps", "p50_ms", "p90_ms",
            "p99_ms", "mean_ms", "max_ms", "mean_queue_ms", "mean_batch_size", "batch_size_histogram",
            "utilization", "partial")
    return {"config": cfg["name"], "policy": cfg["policy"], "params": cfg["params"], "instances": cfg["instances"],
            "arrival": arrival, "cv": cv or 1.0, "load": load, "rep": rep, "capacity_rps": capacity,
            "rate_rps": rate, "seed": seed, "duration_s": duration, "seq_len": seq_len, "requests_in_trace": len(trace),
            "client_processes": processes, "wall_s": round(time.monotonic() - t, 2),
            "summary": {k: summary.get(k) for k in keep}, "live": summary["live"],
            "triton_delta": stats["delta"], "trace_window_ns": window, "trace_rate": args.trace_rate,
            "server_side": summary.get("server_side")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--part", default="1/1", help="K/N: the K-th of N equal shares of the configurations")
    ap.add_argument("--configs", default="", help="comma-separated substrings: only matching configurations")
    ap.add_argument("--loads", default="0.1,0.3,0.5,0.7,0.9")
    ap.add_argument("--arrivals", default="poisson,gamma3")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=3.0, help="trace length per cell, at least")
    ap.add_argument("--min-requests", type=int, default=2000, help="lengthen slow cells to about this many")
    ap.add_argument("--max-duration-s", type=float, default=8.0)
    ap.add_argument("--warmup-s", type=float, default=0.5)
    ap.add_argument("--budget-s", type=float, default=540.0, help="start nothing after this much wall time")
    ap.add_argument("--trace-rate", type=int, default=0,
                    help="also trace one request in N of each cell with Triton's trace API (it kills Triton 2.51 "
                         "under load; the model's execution log gives server-side percentiles without it); 0: off")
    ap.add_argument("--keep-requests", action="store_true",
                    help="also write every cell's per-request times to OUT/requests/CELL.npz (client send and "
                         "answer, execution start and end, batch): the arrivals the server received")
    ap.add_argument("--cpu", action="store_true", help="bert-tiny in numpy on KIND_CPU: check the script off the GPU")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    k, n = (int(x) for x in args.part.split("/"))
    selected = [c for c in configs(args.cpu) if not args.configs or any(s in c["name"] for s in args.configs.split(","))]
    selected = selected[k - 1::n]
    loads = [float(x) for x in args.loads.split(",")]
    arrivals = args.arrivals.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.part.replace("/", "of")
    results = args.out / f"triton_grid_{tag}.jsonl"
    done = set()
    if results.exists():
        for line in results.read_text().splitlines():
            r = json.loads(line)
            done.add((r["config"], r["arrival"], r["load"], r["rep"]))
    info_path = args.out / f"run_info_{tag}.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {
        "machine": platform.node(), "python": sys.version.split()[0], "capacities": {}, "servers": [],
        "failures": [], "server": find_tritonserver().describe()}
    work = Path(tempfile.mkdtemp(prefix="triton-grid-"))

    def over() -> bool:
        return time.monotonic() - t_start > args.budget_s

    for cfg in selected:
        for rep in range(args.reps):
            todo = [(a, lo) for a in arrivals for lo in loads if (cfg["name"], a, lo, rep) not in done]
            if not todo or over():
                continue
            cell_windows: dict = {}
            server = None
            try:
                with start_server(cfg, work, rep, args.cpu) as server:
                    info["servers"].append({"config": cfg["name"], "rep": rep, "ready_s": server.started_s,
                                            "placement": server.placement()})
                    if cfg["name"] not in info["capacities"]:
                        probe = (1500 if cfg["policy"] == "none" else 6000) // (10 if args.cpu else 1)
                        info["capacities"][cfg["name"]] = capacity_rps(
                            server.url, probe, ON_CPU["seq_len"] if args.cpu else SEQ_LEN)
                        print(f"{cfg['name']}: capacity {info['capacities'][cfg['name']]:,.0f} req/s", flush=True)
                    for arrival, load in todo:
                        if over():
                            break
                        row = run_cell(cfg, server.url, arrival, load, info["capacities"][cfg["name"]], rep, args,
                                       work)
                        row["placement"] = server.placement()  # where the processes ran last
                        cell_windows[(cfg["name"], arrival, load, rep)] = row["trace_window_ns"]
                        with open(results, "a") as f:
                            f.write(json.dumps(json_safe(row)) + "\n")
                        s = row["summary"]
                        print(f"{cfg['name']} {arrival} {load:g} rep{rep}: {row['rate_rps']:,.0f} req/s, "
                              f"p50 {s['p50_ms']:.2f} p99 {s['p99_ms']:.2f} ms, batch {s['mean_batch_size']:.1f}, "
                              f"lateness p99 {row['live']['client_lateness_us'].get('p99', float('nan')):.0f} us",
                              flush=True)
            except (InputError, RuntimeError, OSError) as exc:  # OSError: a server that stopped answering
                info["failures"].append({"config": cfg["name"], "rep": rep, "error": str(exc)})
                print(f"{cfg['name']} rep{rep}: FAILED: {exc}", flush=True)
            if server is not None and cell_windows:  # the server has stopped: its trace file is complete
                traced = server_side(server.repository.parent / "trace.json", cell_windows)
                with open(args.out / f"triton_server_side_{tag}.jsonl", "a") as f:
                    for (name, arrival, load, r), figures in traced.items():
                        f.write(json.dumps({"config": name, "arrival": arrival, "load": load, "rep": r,
                                            "trace_rate": args.trace_rate, **figures}) + "\n")
            info_path.write_text(json.dumps(json_safe(info), indent=1) + "\n")
    info["wall_s"] = round(time.monotonic() - t_start, 1)
    info_path.write_text(json.dumps(json_safe(info), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
