"""``schedsim plan``: the fewest replicas (GPUs), and their settings, that meet an SLO at a
target request rate, with the cost per hour, against the naive setting (no batching).

The search is on the replica count N. At each N every candidate setting (a small grid) is
simulated in parallel; N is doubled until some setting meets the SLO, then bisected down.
This assumes that a setting meeting the SLO on N replicas also meets it on N+1 (each
replica gets less load), which holds for the built-in policies on stable loads; the plan
records the evaluation at N-1 so its minimality is on file, not assumed.

Load on N replicas: by default each replica gets QPS/N (the trace replayed at 1/N of the
target rate: an even split, as random routing gives a Poisson stream); with ``router`` the
whole fleet is simulated behind that router (schedsim/planning/fleet.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from schedsim.cost.model import CostModel
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.errors import InputError
from schedsim.planning.executors import run_jobs
from schedsim.planning.grid import cells as grid_cells, label
from schedsim.planning.objective import Constraint, Objective, check_keys, judged, meets, metric_keys, rank
from schedsim.planning.sweep import (SweepSpec, absolute, check_cells, confidence_of, judged_on, run_cell,
                                     with_slo_band)
from schedsim.run.spec import RunSpec
from schedsim.traces.generate import generate
from schedsim.traces.io import load_trace, save_trace, trace_stats

DEFAULT_GRIDS = {
    "dynamic": {"max_queue_delay_us": [0, 500, 1000, 2000, 5000, 10000],
                "preferred_batch_sizes": [(), (8, 16, 32)]},
}
"""Settings tried at each replica count when no --grid is given (others: the policy's defaults)."""


@dataclass(frozen=True)
class PlanSpec:
    base: RunSpec
    """Trace (at its own rate), policy, profile, instances per replica, seed, replications."""
    qps: float
    """Target request rate of the whole fleet."""
    trace_rate: float
    """The trace's own mean rate (requests/s)."""
    slo: tuple[Constraint, ...]
    """What every replica count is checked against."""
    grid: dict
    """Candidate settings of ``base.policy``."""
    objective: Objective = field(default_factory=Objective)
    """Ranks the SLO-meeting settings at the chosen count."""
    naive_policy: str | None = "none"
    """The baseline planned the same way; None = no baseline."""
    router: str | None = None
    """None = split the load evenly; else simulate the fleet behind this router."""
    max_replicas: int = 4096
    """Give up above this many replicas."""
    gpu_cost_per_hour: float = 2.5
    """Price of one GPU-hour (one replica is one GPU; its instances share it)."""
    executor: str = "local"
    workers: int | None = None
    ray_address: str | None = None
    slo_confidence: float | None = None
    """As :attr:`schedsim.planning.sweep.SweepSpec.slo_confidence`: judge the SLO on each
    setting's prediction band (0.95: the 90% band's upper edge); 0 = on the point estimate."""


def at_replicas(spec: PlanSpec, base: RunSpec, n: int) -> RunSpec:
    scale = spec.qps / spec.trace_rate
    if spec.router is None:
        return replace(base, rate_scale=scale / n)
    return replace(base, rate_scale=scale, replicas=n, router=spec.router)


class _Search:
    """Evaluations of one policy's settings at replica counts, memoised."""

    def __init__(self, spec: PlanSpec, base: RunSpec, grid: dict, progress):
        self.spec, self.progress = spec, progress
        self.base = with_slo_band(absolute(base), spec.slo, spec.slo_confidence)
        self.cells = grid_cells(grid) if grid else [{}]
        self.names = list(grid)
        self.results: dict[int, list[dict]] = {}
        self.log: list[dict] = []

    def evaluate(self, n: int) -> dict | None:
        """The best SLO-meeting row at ``n`` replicas (None if none meets)."""
        if n not in self.results:
            keys = tuple(metric_keys(self.spec.slo, self.spec.objective))
            jobs = [(at_replicas(self.spec, self.base, n), cell, keys, self.spec.slo) for cell in self.cells]
            rows = [None] * len(jobs)
            for i, row in run_jobs(run_cell, jobs, self.spec.executor, self.spec.workers,
                                   self.spec.ray_address):
                if row["_missing"]:
                    check_keys({k: 0.0 for k in row["_known"]}, row["_missing"])
                rows[i] = dict(row, cell=i, replicas=n, meets_slo=meets(row, self.spec.slo),
                               **{k: label(v) for k, v in self.cells[i].items()})
            self.results[n] = rows
            order = rank(rows, self.spec.slo, self.spec.objective)
            top = rows[order[0]]
            self.log.append({"replicas": n, "meets_slo": top["meets_slo"],
                             **{c.key: top.get(c.key) for c in self.spec.slo},
                             "settings": {k: top[k] for k in self.names}})
            if self.progress:
                self.progress(n, top["meets_slo"])
        rows = self.results[n]
        order = rank(rows, self.spec.slo, self.spec.objective)
        return rows[order[0]] if rows[order[0]]["meets_slo"] else None

    def fewest(self, start: int) -> tuple[int, dict]:
        """Gallop up from ``start`` until a count meets the SLO, then bisect."""
        lo, n = start - 1, start   # lo: the largest count known to fail (0 = none tried)
        while self.evaluate(n) is None:
            lo = n
            if n >= self.spec.max_replicas:
                return None, None
            n = min(2 * n, self.spec.max_replicas)
        hi = n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.evaluate(mid) is None:
                lo = mid
            else:
                hi = mid
        if hi > 1:
            self.evaluate(hi - 1)  # on file: one fewer fails
        return hi, self.evaluate(hi)


def capacity_rps(base: RunSpec, seq_len: int) -> float:
    """An upper bound on one replica's request rate: its best samples/s at any batch size,
    one sample per request, every instance busy without contention."""
    cost = CostModel.from_profile(load_profile(base.profile or default_profile_path()),
                                  extrapolate=base.extrapolate)
    best = max(b / cost.mean_s(b, seq_len) for b in range(cost.min_batch, cost.max_batch + 1))
    return best * (base.instances or 1)


def plan(spec: PlanSpec, seq_len: int = 0, progress=None) -> dict:
    """Plan ``spec.base.policy`` and the naive baseline; the plan as a dict (plan.json)."""
    if not spec.qps > 0:
        raise InputError(f"--qps: {spec.qps} is not valid; expected a number > 0")
    if not spec.slo:
        raise InputError("--slo-p99-ms / --slo: a plan needs an SLO to meet")
    if spec.max_replicas < 1:
        raise InputError(f"--max-replicas: {spec.max_replicas} is not valid; expected an integer >= 1")
    if not spec.gpu_cost_per_hour >= 0:
        raise InputError(f"--gpu-cost-per-hour: {spec.gpu_cost_per_hour} is not valid; expected >= 0")
    check_cells(SweepSpec(base=spec.base, grid=spec.grid), grid_cells(spec.grid) if spec.grid else [{}])
    # Fewer replicas than load / capacity cannot keep up: start the search there.
    start = max(1, math.floor(spec.qps / capacity_rps(spec.base, seq_len)))
    start = min(start, spec.max_replicas)
    out = {"qps": spec.qps, "slo": [str(c) for c in spec.slo], "objective": str(spec.objective),
           "load": f"behind router {spec.router}" if spec.router else "split evenly: QPS/N per replica",
           "gpu_cost_per_hour": spec.gpu_cost_per_hour,
           "instances_per_replica": spec.base.instances or 1, "plans": {}}
    policies = [(spec.base.policy, spec.base, spec.grid)]
    if spec.naive_policy and spec.naive_policy != spec.base.policy:
        naive = replace(spec.base, policy=spec.naive_policy, params={})
        policies.append((spec.naive_policy, naive, {}))
    searched: list[dict] = []
    for name, base, grid in policies:
        search = _Search(spec, base, grid, progress and (lambda n, ok, name=name: progress(name, n, ok)))
        n, row = search.fewest(start)
        entry = {"policy": name, "replicas": n, "gpus": n, "search": search.log}
        if n is not None:
            entry["cost_per_hour"] = n * spec.gpu_cost_per_hour
            entry["settings"] = {k: row[k] for k in grid}
            entry["metrics"] = {k: row.get(k) for k in ("p50_ms", "p99_ms", "p999_ms", "throughput_rps",
                                                           "mean_batch_size", "utilization")}
            entry["slo_margins"] = {str(c): c.margin(row.get(c.key)) for c in spec.slo}
            bands = {str(c): [row[f"{c.key}_lo"], row[f"{c.key}_hi"]] for c in spec.slo if f"{c.key}_hi" in row}
            if bands:
                entry["slo_bands"] = bands
                entry["slo_judged_margins"] = {str(c): c.margin(judged(row, c)) for c in spec.slo}
            fewer = search.results.get(n - 1)
            if fewer:
                worst = rank(fewer, spec.slo, spec.objective)[0]
                entry["one_fewer"] = {"replicas": n - 1, "meets_slo": fewer[worst]["meets_slo"],
                                      **{c.key: fewer[worst].get(c.key) for c in spec.slo}}
        out["plans"][name] = entry
        searched += [r for rows in search.results.values() for r in rows]
    out["slo_confidence"] = confidence_of(spec.slo_confidence)
    out["slo_judged_on"] = judged_on(searched, spec.slo, spec.slo_confidence)
    main = out["plans"][spec.base.policy]
    if main["replicas"] is None:
        raise InputError(f"--slo: {spec.base.policy} does not meet {' and '.join(out['slo'])} at "
                         f"{spec.qps:g} QPS with up to {spec.max_replicas} replicas (--max-replicas)")
    naive = out["plans"].get(spec.naive_policy)
    if naive and naive["replicas"]:
        out["savings"] = {"gpus_saved": naive["replicas"] - main["replicas"],
                          "ratio": naive["replicas"] / main["replicas"],
                          "cost_per_hour_saved": (naive["replicas"] - main["replicas"]) * spec.gpu_cost_per_hour}
    return out


def trace_for_plan(trace: Path | None, arrival: str, cv: float | None, requests: int, qps: float,
                   seed: int, out_dir: Path) -> tuple[Path, float, int]:
    """The trace to plan on, its mean rate and its seq_len: the given file, or one generated
    at the target rate (written into ``out_dir`` so every worker reads the same requests)."""

    if trace is not None:
        loaded = load_trace(trace)
        rate = trace_stats(loaded)["mean_rate"]
        if not rate > 0 or not math.isfinite(rate):
            raise InputError(f"{trace}: needs at least two requests at different times to have a rate")
        seq = int(loaded.seq_len[0]) if len(loaded) else 0
        return trace, rate, seq
    if arrival not in ("poisson", "gamma"):
        raise InputError(f"--arrival: {arrival!r} is not valid; expected poisson or gamma (or give --trace)")
    if arrival == "gamma" and cv is None:
        raise InputError("--cv: --arrival gamma needs --cv")
    if requests < 2:
        raise InputError(f"--requests: {requests} is not valid; expected an integer >= 2")
    params = {"rate": qps} | ({"cv": cv} if arrival == "gamma" else {})
    made = generate(arrival, rng=np.random.default_rng(seed), n=requests, **params)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = save_trace(made, out_dir / "plan_trace.csv")
    return path, trace_stats(load_trace(path))["mean_rate"], 0
