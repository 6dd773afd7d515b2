"""Why does a cell's live run drift from the prediction? Live step log against the step model, per run.

    python experiments/fidelity-llm/diagnose_static.py --runs run11,run12,run13 --cell static-b8-medium

For one cell of several recorded runs (runN/cells/CELL/: live_steps.csv.gz, summary.json,
live.json; runN/run_info.json) it prints:

1. setup: the cell's place in the run, the pinned CPU and its probe loop (taken once, at
   process start), the warm-up, versions;
2. graph (decode) steps by rows: GPU time (CUDA events), host time = step period - GPU
   time, split into the engine call's host part (engine_ms - gpu_ms) and the loop's
   (period - engine_ms), the live period and the model's price (the committed profile's
   fit, which includes host time, plus its loop overhead), medians;
3. all steps: live busy time, GPU, host, the model's price of the same steps, host-time
   percentiles, and how much of the host time is in steps over 1 ms (outliers);
4. host time per graph step over the cell's time, median per --bin-s seconds;
5. the schedule: which requests share a step with a prefill (for ``static``: a batch),
   live against the simulation, up to the first divergence, with the live lag behind the
   simulation at each boundary and the simulation's slack there (the next arrival after
   the boundary: a lag beyond it moves that request into the batch);
6. sensitivity: the simulation with --add-us more host time on every step: steps with a
   prefill, and TTFT/TPOT/E2E p50/p99, beside each run's measured figures;
7. the other cells of the same runs: host time per graph step and the graph steps' live
   period over the model's price, medians, and the results CSV's TTFT/TPOT p50 errors.

The live period of a step followed by idle time (next start more than 1 ms after its end)
is its own start-to-end time. No fitting to live results: the model is the committed one.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import analyze  # noqa: E402
from experiments.raw_runs import require  # noqa: E402
from common import load_cell_trace, load_cells  # noqa: E402

ROWS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 1 << 30))
IDLE_MS = 1.0


def cost_model(add_us: float = 0.0):
    from schedsim.cost.step_model import StepCostModel
    from schedsim.cost.step_profile import load_step_profile

    cost = StepCostModel.from_profile(load_step_profile(analyze.PROFILE))
    a, b = cost.loop_ns
    cost.loop_ns = (a + add_us * 1e3, b)   # more host time on every step, graph or eager
    return cost


def live_steps(run: Path, cell: str, cost) -> pd.DataFrame:
    """The cell's ok steps with period, host and the model's price (ms)."""
    path = run / "cells" / cell / "live_steps.csv.gz"
    d = pd.read_csv(path)
    d = d[(d.status == "ok") & d.gpu_ms.notna()].reset_index(drop=True)
    p = analyze.priced_steps(path, cost)
    a, b = cost.loop_ns
    d["pred"] = p["pred"] + (a + b * d.n_rows) / 1e6   # engine call + the loop's overhead
    nxt = d.start_s.shift(-1)
    idle = ((nxt - d.end_s) * 1e3 > IDLE_MS) | nxt.isna()
    d["period"] = np.where(idle, d.end_s - d.start_s, nxt - d.start_s) * 1e3
    d["host"] = d.period - d.gpu_ms
    d["ehost"] = d.engine_ms - d.gpu_ms
    d["loop"] = d.period - d.engine_ms
    d["idle_after"] = idle
    return d


def batches_live(d: pd.DataFrame) -> list[tuple]:
    """(start_s, end_s, rows) per step with a prefill, to the last step before the next one."""
    first = np.flatnonzero(d.prefill_rows.to_numpy() > 0)
    ends = np.append(first[1:] - 1, len(d) - 1)
    return [(d.start_s[i], d.end_s[j], int(d.n_rows[i])) for i, j in zip(first, ends)]


def first_difference(sim_b: list[tuple], other: list[tuple], default=None):
    """Index of the first batch whose row count differs from the simulation's."""
    return next((k for k, (x, y) in enumerate(zip(sim_b, other)) if x[2] != y[2]), default)


def simulate(cell: dict, cells_mod, add_us: float = 0.0):
    from schedsim.core.llm_metrics import summarize_llm
    from schedsim.core.llm_simulate import simulate_llm
    from schedsim.registry import build_policy
    from schedsim.core.policy import Requests

    trace = load_cell_trace(HERE / "traces" / f"{cell['name']}.npz")
    policy = build_policy(cells_mod.policy_name(cell), dict(cell["params"]))
    cost = cost_model(add_us)
    cost.bytes_per_block = policy.budget.block_size * policy.budget.spec.kv_bytes_per_token
    r = simulate_llm(Requests.from_trace(trace), policy, cost, seed=1)
    pre = np.flatnonzero(r.step_prefill_tokens > 0)
    ends = np.append(pre[1:] - 1, len(r.step_start_ns) - 1)
    batches = [(r.step_start_ns[i] / 1e9, r.step_end_ns[j] / 1e9, int(r.step_seqs[i])) for i, j in zip(pre, ends)]
    return summarize_llm(r), batches, trace.arrival_s


def med(x) -> float:
    x = np.asarray(x, dtype=float)
    return float(np.median(x)) if x.size else float("nan")


def section(title: str) -> None:
    print(f"\n== {title}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="run11,run12,run13", help="comma-separated runN folders (under this directory)")
    ap.add_argument("--cell", default="static-b8-medium")
    ap.add_argument("--add-us", default="0,10,20,50,75,100,150,200,250", help="host us added per step in the sensitivity runs")
    ap.add_argument("--bin-s", type=float, default=4.0)
    ap.add_argument("--batches", type=int, default=10, help="schedule rows to print")
    args = ap.parse_args(argv)
    runs = [HERE / r.strip() for r in args.runs.split(",")]
    require(*runs)
    cells_mod = load_cells()
    cell = next(c for c in cells_mod.CELLS if c["name"] == args.cell)
    cost = cost_model()
    steps = {r.name: live_steps(r, args.cell, cost) for r in runs}

    section(f"1. setup ({args.cell})")
    for r in runs:
        info = json.loads((r / "run_info.json").read_text())
        live = json.loads((r / "cells" / args.cell / "live.json").read_text())
        pin, w, m = info.get("cpu_pinning") or {}, info.get("setup", {}), info.get("machine", {})
        probe = pin.get("probe_loop_ms", {})
        print(f"{r.name}: cell {info['cells_done'].index(args.cell) + 1} of {len(info['cells_done'])}, cpu {pin.get('cpu')} "
              f"probe {probe.get(str(pin.get('cpu')))} ms (fastest {min(probe.values(), default=None)}, median of all "
              f"{med(list(probe.values())):.2f}), after pinning {pin.get('loop_ms')} ms; warm-up {w.get('engine_warmup_s', 0):.1f} s, "
              f"eager steps {w.get('warmup_eager_steps')}, dense {w.get('warmup_dense_steps', 0)}; torch {m.get('torch')} "
              f"driver {m.get('driver')}; options {live.get('options')}; cell wall {live.get('wall_s', 0):.1f} s")

    section("2. graph steps by rows (medians): GPU ms | host us = engine host + loop | period ms | model ms | period/model")
    for lo, hi in ROWS:
        for name, d in steps.items():
            g = d[d.graph & (d.n_rows >= lo) & (d.n_rows <= hi)]
            if len(g):
                print(f"rows {lo}-{hi if hi < 1 << 30 else 'up'} {name:6s} n {len(g):5d} | GPU {med(g.gpu_ms):.3f} | host "
                      f"{med(g.host) * 1e3:4.0f} = {med(g.ehost) * 1e3:4.0f} + {med(g.loop) * 1e3:3.0f} | period "
                      f"{med(g.period):.3f} | model {med(g.pred):.3f} | {med(g.period / g.pred):.3f}")

    section("3. all steps: sums (s) and host us per step percentiles p10/p50/p90/p99")
    for name, d in steps.items():
        for kind, s in (("graph", d[d.graph]), ("eager", d[~d.graph])):
            h = s.host.to_numpy() * 1e3
            big = h > 1000
            print(f"{name:6s} {kind}: n {len(s):5d} live {s.period.sum() / 1e3:6.2f} = GPU {s.gpu_ms.sum() / 1e3:6.2f} + host "
                  f"{s.host.sum() / 1e3:5.2f} | model {s.pred.sum() / 1e3:6.2f} (live/model {s.period.sum() / s.pred.sum():.3f}) | "
                  f"host p10/50/90/99 {' '.join(f'{v:5.0f}' for v in np.percentile(h, [10, 50, 90, 99]))} | "
                  f"steps >1 ms host: {big.sum()} holding {h[big].sum() / max(h.sum(), 1e-9) * 100:.0f}% of host")

    section(f"4. host us per graph step over the cell, median per {args.bin_s:g} s")
    for name, d in steps.items():
        g = d[d.graph]
        by = g.groupby((g.start_s // args.bin_s).astype(int)).host.median() * 1e3
        print(f"{name:6s} " + " ".join(f"{v:4.0f}" for v in by))

    section("5. schedule: steps with a prefill (static: batches), live against the simulation")
    sim_summary, sim_b, arrival = simulate(cell, cells_mod)
    live_b = {n: batches_live(d) for n, d in steps.items()}
    print(f"sim    {len(sim_b):3d}: {[b[2] for b in sim_b]}")
    for name, lb in live_b.items():
        print(f"{name:6s} {len(lb):3d}: {[b[2] for b in lb]}  first difference: batch {first_difference(sim_b, lb)}")
    # The busy stretch before the first difference: where the live lag that moved a request came from.
    stretch = []
    for k in range(len(sim_b)):
        stretch.append(k if k == 0 or sim_b[k][0] - sim_b[k - 1][1] > 1e-3 else stretch[-1])
    cuts = set()
    for lb in live_b.values():
        div = first_difference(sim_b, lb)
        if div:
            cuts.add((stretch[div - 1], div))
    for k0, div in sorted(cuts):
        print(f"batches {k0}-{div - 1} (the busy stretch before a first difference), in the runs whose batches "
              "are the simulation's to there:")
        for name, d in steps.items():
            lb = live_b[name]
            if any(x[2] != y[2] for x, y in zip(sim_b[:div + 1], lb[:div])) or len(lb) <= div:
                continue
            s = d[(d.start_s >= lb[k0][0]) & (d.start_s < lb[div][0])]
            print(f"  {name:6s} {len(s)} steps, live {s.period.sum():5.0f} ms = GPU {s.gpu_ms.sum():5.0f} + host {s.host.sum():4.0f} "
                  f"({s.host.mean() * 1e3:3.0f} us/step); model {s.pred.sum():5.0f} ms; live - model {s.period.sum() - s.pred.sum():+4.0f} ms")
    print("batch | sim start-end s, rows | next arrival after sim end (slack ms) | busy since s | flip at lag/busy | "
          + " | ".join(f"{n}: rows, live end - sim end ms" for n in steps))
    busy_from = sim_b[0][0]
    for k, (s0, s1, rows) in enumerate(sim_b[:args.batches]):
        if k and s0 - sim_b[k - 1][1] > 1e-3:
            busy_from = s0   # the engine was idle before this batch: no lag carries over
        later = arrival[arrival > s1]
        slack = (later[0] - s1) * 1e3 if later.size else float("nan")
        cols = [f"{lb[k][2]}, {(lb[k][1] - s1) * 1e3:+6.0f}" if k < len(lb) else "-" for lb in live_b.values()]
        print(f"{k:3d} | {s0:6.3f}-{s1:6.3f} {rows} | {slack:6.1f} | {busy_from:6.3f} | "
              f"{slack / max(s1 - busy_from, 1e-9) / 10:5.1f}% | " + " | ".join(cols))

    section("6. sensitivity: the simulation with more host time per step, against the runs' measurements")
    keys = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
    print("case       batches 1st diff | " + " ".join(f"{k[:-3]:>9s}" for k in keys) + " | first batches")
    for add in (float(x) for x in args.add_us.split(",")):
        s, b, _ = simulate(cell, cells_mod, add) if add else (sim_summary, sim_b, None)
        print(f"sim +{add:3.0f} us  {len(b):4d} {first_difference(sim_b, b, '-'):>6} | " + " ".join(f"{s[k]:9.2f}" for k in keys)
              + f" | {[x[2] for x in b[:12]]}")
    for name, lb in live_b.items():
        s = json.loads((HERE / name / "cells" / args.cell / "summary.json").read_text())
        print(f"live {name:6s} {len(lb):4d} {first_difference(sim_b, lb, '-'):>6} | " + " ".join(f"{s[k]:9.2f}" for k in keys)
              + f" | {[x[2] for x in lb[:12]]}")

    section("7. other cells of these runs: host us per graph step p50 | graph period/model p50 | TTFT, TPOT p50 error")
    for r in runs:
        res = {}
        table = HERE / f"results-{r.name}" / "fidelity_llm.csv"
        default = HERE / "results" / "summary.json"   # run 7's analysis is the default results/
        if not table.exists() and default.exists() and json.loads(default.read_text()).get("run", "").endswith(r.name):
            table = default.with_name("fidelity_llm.csv")
        if table.exists():
            res = {row["cell"]: row for row in csv.DictReader(table.open())}
        out = []
        for c in cells_mod.CELLS:
            if not (r / "cells" / c["name"] / "live_steps.csv.gz").exists():
                continue
            g = live_steps(r, c["name"], cost)
            g = g[g.graph]
            e = res.get(c["name"], {})
            out.append(f"{c['name']} {med(g.host) * 1e3:.0f} {med(g.period / g.pred):.3f} "
                       f"{float(e.get('ttft_p50_err_pct', 'nan')):+.0f}/{float(e.get('tpot_p50_err_pct', 'nan')):+.0f}%")
        print(f"{r.name}: " + " | ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
