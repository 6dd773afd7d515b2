"""``schedsim sweep``: one ``schedsim run`` per grid cell, in parallel, ranked against an SLO.

Every cell is :func:`schedsim.run.runner.execute` on the base spec with the cell's settings,
so a cell's numbers are exactly what ``schedsim run`` prints for the same flags and seed.
Rows are appended to DIR/cells.csv as cells finish (an interrupted sweep keeps them);
DIR/sweep.csv (ranked), DIR/best.json and the plots are written at the end, atomically,
and from the sorted rows only, so the local and Ray executors write the same bytes.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from schedsim.errors import InputError
from schedsim.files import replaced_atomically, write_json
from schedsim.planning.executors import run_jobs
from schedsim.planning.grid import cells as grid_cells, label, split_cell
from schedsim.planning.objective import (Constraint, Objective, band_level, check_keys, judged, meets, metric_keys,
                                         pareto, rank, slo_basis)
from schedsim.registry import build_policy
from schedsim.run.bands import plan_band
from schedsim.run.runner import execute, policy_params
from schedsim.run.spec import RunSpec, check_spec

METRICS = ("throughput_rps", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms",
           "mean_queue_ms", "mean_batch_size", "completed", "rejected", "unfinished")
"""summary.json keys every sweep row carries (plus the SLO's and the objective's)."""
CI_METRICS = ("throughput_rps", "p99_ms")


@dataclass(frozen=True)
class SweepSpec:
    """A sweep: the run every cell starts from, the grid, and how to judge the cells."""

    base: RunSpec
    """Flags shared by every cell (trace, policy, profile, seed, replications ...)."""
    grid: dict
    """{name: values}, from :func:`schedsim.planning.grid.parse_grid`."""
    slo: tuple[Constraint, ...] = ()
    """Constraints a setting must meet; () = every setting meets."""
    objective: Objective = field(default_factory=Objective)
    """What ranks the SLO-meeting cells."""
    executor: str = "local"
    """local (processes) or ray."""
    workers: int | None = None
    """Parallel cells; None = every CPU (local) or the cluster's (ray)."""
    ray_address: str | None = None
    """Ray cluster address; None = start a local Ray."""
    out: Path | None = None
    """Directory for cells.csv, sweep.csv, best.json and plots."""
    plot: bool = True
    """Write the PNG plots into ``out``."""
    slo_confidence: float | None = None
    """Judge the SLO on each cell's prediction band: the confidence that one live run meets it
    (0.95: the 90% band's upper edge); 0 = on the point estimate; None = 0.95 up to the
    trace length ``schedsim run`` gives a band by default, else the point estimate."""


def with_slo_band(base: RunSpec, slo: tuple, confidence: float | None) -> RunSpec:
    """``base`` with the band its cells need: none without an SLO or at confidence 0."""
    if not slo:
        return replace(base, band=0)
    return replace(base, band=None if confidence is None else band_level(confidence))


def confidence_of(confidence: float | None) -> float:
    return 0.95 if confidence is None else confidence


@dataclass
class SweepOutcome:
    rows: list
    """One dict per finished cell, best first."""
    order_names: list
    best: dict | None
    """The best SLO-meeting row, or None."""
    closest: dict | None
    """With no SLO-meeting row: the one nearest the SLO."""
    complete: bool
    total: int
    written: list = field(default_factory=list)


def absolute(base: RunSpec) -> RunSpec:
    """Paths made absolute, so worker processes (Ray's included) find the same files."""
    def resolve(p):
        return None if p is None else Path(p).resolve()

    policy = base.policy
    where, sep, name = policy.rpartition(":")
    if sep and where.endswith(".py"):
        policy = f"{Path(where).resolve()}:{name}"
    return replace(base, trace=resolve(base.trace), profile=resolve(base.profile),
                   triton_config=resolve(base.triton_config), policy=policy,
                   contention_profiles=tuple(resolve(p) for p in base.contention_profiles),
                   out=None, plot=False)


def cell_spec(base: RunSpec, cell: dict) -> RunSpec:
    params, run = split_cell(cell)
    return replace(base, params=dict(base.params) | params, **run)


_LOADED: list = []
"""The trace last loaded in this process, as [(path, modification time, size), trace]: a sweep's
cells share their trace, and forked workers inherit what the command loaded before forking."""


def cell_trace(spec: RunSpec):
    """``spec``'s trace, loaded once per process (reading a 1,000,000-request CSV is about
    40 ms, which every cell paid again). Its arrays are made read-only, so no cell can change
    what the next one reads."""
    path = Path(spec.trace)
    try:
        stat = path.stat()
    except OSError:
        return None  # load_trace says what is wrong, in the cell's own run
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if not _LOADED or _LOADED[0] != key:
        from schedsim.traces.io import load_trace

        trace = load_trace(path)
        for value in vars(trace).values():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
        _LOADED[:] = [key, trace]
    return _LOADED[1]


def run_cell(base: RunSpec, cell: dict, keys: tuple, slo: tuple = ()) -> dict:
    """One cell: its summary's scalar metrics (means over replications), CIs and, when
    ``base`` asks for a band, the SLO metrics' band edges. A band's edge on the SLO's side is
    never better than the point estimate, so a cell that misses ``slo`` at its point
    estimate misses it on the band too: its band is not computed."""
    spec = cell_spec(base, cell)
    trace = cell_trace(spec)
    summary = execute(replace(spec, band=0) if slo and spec.band != 0 else spec, trace=trace).summary
    if slo and spec.band != 0 and meets(summary, slo):
        plan, note = plan_band(spec.band, len(trace), spec.band_replications, spec.band_arrivals)
        if plan is not None:
            summary = execute(spec, trace=trace).summary
        elif note:  # no band for this run (too many requests): the same run, and the note it prints
            summary = summary | {"notes": [*summary.get("notes", []), note]}
    row = {}
    for key in dict.fromkeys(METRICS + tuple(keys)):
        value = summary.get(key)
        row[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        ci = summary.get(f"{key}_ci")
        if ci:
            row[f"{key}_ci_lo"], row[f"{key}_ci_hi"] = float(ci[0]), float(ci[1])
    util = summary.get("utilization") or []
    row["utilization"] = float(sum(util) / len(util)) if util else None
    for key in keys:
        if isinstance(summary.get(f"{key}_hi"), (int, float)):
            row[f"{key}_lo"], row[f"{key}_hi"] = float(summary[f"{key}_lo"]), float(summary[f"{key}_hi"])
    row["_notes"] = [n for n in summary.get("notes", []) if "prediction band" in n]
    row["_band_absent"] = list((summary.get("band") or {}).get("absent", []))
    row["_missing"] = [k for k in keys if not isinstance(summary.get(k), (int, float))]
    row["_known"] = sorted(k for k, v in summary.items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool))
    return row


def check_cells(spec: SweepSpec, cells: list[dict]) -> None:
    """Build every cell's policy here, before any work: a bad name or value is one line."""
    for cell in cells:
        cspec = cell_spec(spec.base, cell)
        check_spec(cspec)
        params, _ = policy_params(cspec)
        try:
            build_policy(cspec.policy, params)
        except InputError as exc:
            raise InputError(f"--grid: {exc}") from None
        except (TypeError, ValueError) as exc:
            shown = ", ".join(f"{k}={label(v)}" for k, v in cell.items())
            raise InputError(f"--grid: {shown}: {type(exc).__name__}: {exc}") from None


def columns(spec: SweepSpec) -> list[str]:
    keys = metric_keys(spec.slo, spec.objective)
    metrics = list(dict.fromkeys(METRICS + tuple(keys))) + ["utilization"]
    ci = []
    if spec.base.replications > 1:
        for key in dict.fromkeys(CI_METRICS + tuple(keys)):
            ci += [f"{key}_ci_lo", f"{key}_ci_hi"]
    band = [] if not spec.slo or spec.slo_confidence == 0 else \
        [f"{c.key}_{side}" for c in dict.fromkeys(c for c in spec.slo) for side in ("lo", "hi")]
    return ["cell", *spec.grid, "meets_slo", "slo_margin", *metrics, *ci, *dict.fromkeys(band)]


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
    return str(value)


def csv_line(row: dict, cols: list[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_fmt(row.get(c)) for c in cols])
    return buf.getvalue()


def finish_row(row: dict, cell_index: int, cell: dict, spec: SweepSpec) -> dict:
    row = dict(row, cell=cell_index, **{k: label(v) for k, v in cell.items()})
    row["meets_slo"] = meets(row, spec.slo)
    row["slo_margin"] = min((c.margin(judged(row, c)) for c in spec.slo), default=None)
    return row


def run_sweep(spec: SweepSpec, progress=None) -> SweepOutcome:
    """Run every cell; write outputs; return the ranked rows. Ctrl-C keeps finished cells."""
    cells = grid_cells(spec.grid)
    if not cells:
        raise InputError("--grid: no cells")
    check_cells(spec, cells)
    base = with_slo_band(absolute(spec.base), spec.slo, spec.slo_confidence)
    keys = tuple(metric_keys(spec.slo, spec.objective))
    cols = columns(spec)
    out = spec.out
    live = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("sweep.csv", "best.json"):
            (out / stale).unlink(missing_ok=True)  # an old ranking must not vouch for new cells
        live = open(out / "cells.csv", "w", encoding="utf-8", newline="")
        live.write(csv_line({c: c for c in cols}, cols))
        live.flush()
    rows: list[dict] = []
    complete = False
    cell_trace(base)  # loaded here, before a local pool forks its workers
    try:
        jobs = [(base, cell, keys, spec.slo) for cell in cells]
        for i, row in run_jobs(run_cell, jobs, spec.executor, spec.workers, spec.ray_address):
            if row["_missing"]:
                check_keys({k: 0.0 for k in row["_known"]}, row["_missing"])
            row = finish_row(row, i, cells[i], spec)
            rows.append(row)
            if live is not None:
                live.write(csv_line(row, cols))
                live.flush()
            if progress is not None:
                progress(len(rows), len(cells))
        complete = True
    except KeyboardInterrupt:
        pass  # keep what finished; the outputs say the sweep is partial
    finally:
        if live is not None:
            live.close()
    outcome = summarise(rows, spec, cells, complete)
    if out is not None and rows:
        outcome.written = write_outputs(out, outcome, spec, cols)
    if not complete:
        raise KeyboardInterrupt
    return outcome


def summarise(rows: list[dict], spec: SweepSpec, cells: list, complete: bool) -> SweepOutcome:
    order = rank(rows, spec.slo, spec.objective)
    ranked = [rows[i] for i in order]
    best = ranked[0] if ranked and ranked[0]["meets_slo"] else None
    closest = None if best or not ranked else ranked[0]
    return SweepOutcome(ranked, list(spec.grid), best, closest, complete, len(cells))


def describe(row: dict, spec: SweepSpec) -> dict:
    """A cell for best.json: its settings, metrics, CIs and the margin to each SLO term."""
    settings = {name: row[name] for name in spec.grid}
    metrics = {k: row.get(k) for k in dict.fromkeys(METRICS + tuple(metric_keys(spec.slo, spec.objective)))}
    ci = {k[: -len("_ci_lo")]: [row[k], row[k[:-2] + "hi"]] for k in row if k.endswith("_ci_lo")}
    margins = []
    for c in spec.slo:
        value = row.get(c.key)
        entry = {"slo": str(c), "value": value, "margin": c.margin(value),
                 "relative_margin": c.relative_margin(value)}
        edge = f"{c.key}_hi" if c.op[0] == "<" else f"{c.key}_lo"
        if row.get(edge) is not None:
            entry |= {"band": [row[f"{c.key}_lo"], row[f"{c.key}_hi"]], "judged_value": judged(row, c),
                      "judged_margin": c.margin(judged(row, c))}
        if c.key in ci:
            lo, hi = ci[c.key]
            worst = hi if c.op[0] == "<" else lo
            # Whether the SLO holds across the confidence interval, not just at the mean.
            entry["met_across_ci"] = c.holds(worst)
        margins.append(entry)
    return {"cell": row["cell"], "settings": settings, "metrics": metrics, "ci95": ci,
            "slo_margins": margins, "meets_slo": row["meets_slo"]}


def write_outputs(out: Path, outcome: SweepOutcome, spec: SweepSpec, cols: list[str]) -> list[Path]:
    written = []
    path = out / "sweep.csv"
    with replaced_atomically(path) as tmp:
        tmp.write_text("".join([csv_line({c: c for c in cols}, cols)]
                               + [csv_line(r, cols) for r in outcome.rows]), encoding="utf-8")
    written.append(path)
    if spec.plot:
        # lazy: imports matplotlib (about a second); only plots need it
        from schedsim.planning.sweep_plots import write_sweep_plots

        written += write_sweep_plots(out, outcome.rows, spec, pareto(outcome.rows))
    b = spec.base
    best = {
        "complete": outcome.complete,
        "cells_done": len(outcome.rows), "cells_total": outcome.total,
        "slo": [str(c) for c in spec.slo],
        "objective": str(spec.objective), "tie_tolerance": spec.objective.tie_tolerance,
        "tiebreak": spec.objective.tiebreak,
        "slo_confidence": confidence_of(spec.slo_confidence) if spec.slo else None,
        "slo_judged_on": judged_on(outcome.rows, spec.slo, spec.slo_confidence) if spec.slo else None,
        "best": describe(outcome.best, spec) if outcome.best else None,
        "closest": describe(outcome.closest, spec) if outcome.closest else None,
        "meeting_slo": sum(r["meets_slo"] for r in outcome.rows),
        "grid": {k: [label(v) for v in vals] for k, vals in spec.grid.items()},
        "config": {"trace": str(b.trace), "policy": b.policy, "params": {k: label(v) for k, v in b.params.items()},
                   "profile": None if b.profile is None else str(b.profile),
                   "instances": b.instances, "seed": b.seed, "replications": b.replications,
                   "warmup_s": b.warmup_s, "rate_scale": b.rate_scale},
    }
    path = out / "best.json"
    write_json(path, best)
    written.append(path)
    return written


def judged_on(rows: list[dict], slo: tuple, confidence: float | None) -> str:
    """What the SLO verdicts on ``rows`` rest on, in words."""
    banded = any(row.get(f"{c.key}_hi") is not None for row in rows for c in slo)
    text = slo_basis(confidence_of(confidence), banded)
    notes = {n for row in rows for n in row.get("_notes", [])}
    absent = dict.fromkeys(a for row in rows for a in row.get("_band_absent", []))
    return (text + (f" ({next(iter(notes))})" if notes and not banded else "")
            + "".join(f"; not in the band: {a}" for a in absent if banded))


def run_command(row: dict, spec: SweepSpec) -> str:
    """The ``schedsim run`` command line that reproduces one cell on its own."""
    b = spec.base
    parts = ["schedsim run", str(b.trace), f"--policy {b.policy}"]
    if b.profile is not None:
        parts.append(f"--profile {b.profile}")
    settings = {**{k: label(v) for k, v in b.params.items()}, **{k: row[k] for k in spec.grid}}
    for name, value in settings.items():
        flag = {"preferred_batch_sizes": "preferred-batch-size"}.get(name, name.replace("_", "-"))
        if name in ("instances", "rate_scale") or flag in _RUN_FLAGS:
            if value != "none":
                parts.append(f"--{flag} {value.replace('/', ',')}")
        else:
            parts.append(f"--param {name}={value}")
    if b.instances and "instances" not in spec.grid:
        parts.append(f"--instances {b.instances}")
    if b.rate_scale != 1.0 and "rate_scale" not in spec.grid:
        parts.append(f"--rate-scale {b.rate_scale:g}")
    if b.warmup_s:
        parts.append(f"--warmup-s {b.warmup_s:g}")
    parts.append(f"--seed {b.seed}")
    if b.replications > 1:
        parts.append(f"--replications {b.replications}")
    return " ".join(parts)


_RUN_FLAGS = {"max-batch-size", "preferred-batch-size", "max-queue-delay-us", "priority-levels",
              "default-priority-level", "max-queue-size", "default-timeout-us", "timeout-action",
              "batch-size", "max-wait-us"}
