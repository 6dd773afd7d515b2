"""``schedsim sweep``, and the options it shares with ``schedsim plan`` and ``schedsim autoscale``.

InputError propagates; the top-level CLI prints it as one line with exit status 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from schedsim.cli import options as o
from schedsim.errors import InputError

# The commands import their implementation (the drivers, the simulator, numpy, pyarrow)
# inside their bodies: --help imports this module to list them, and those imports cost
# about 0.5 s that listing the commands does not need.

Grid = Annotated[list[str], typer.Option(
    help="NAME=START:STOP:STEP (inclusive) or NAME=V1,V2,... (repeatable); values: numbers, "
         "none, true/false, lists as 8/16/32. NAME: a policy parameter, instances or rate_scale.")]
Slo = Annotated[list[str], typer.Option(
    help="Constraint on a summary.json metric, e.g. p99_ms<=50 or throughput_rps>=9000 (repeatable).")]
SloP99 = Annotated[Optional[float], typer.Option(help="Shorthand for --slo p99_ms<=X.")]
Executor = Annotated[str, typer.Option(help="local (processes on this machine) or ray.")]
RayAddress = Annotated[Optional[str], typer.Option(
    help="Ray cluster: HOST:PORT, ray://HOST:PORT or auto (default: start a local Ray).")]
Workers = Annotated[Optional[int], typer.Option(help="Cells run at once (default: every CPU).")]
Profile = Annotated[Optional[Path], typer.Option(help="Cost table CSV (default: the bundled H200 profile).")]
Seed = Annotated[int, typer.Option(help="Seed of the first replication, the same for every cell.")]
Replications = Annotated[int, typer.Option(help="Runs per cell with seeds seed, seed+1, ...; gives 95% CIs.")]
SloConfidence = Annotated[Optional[float], typer.Option(
    help="Judge the SLO on each setting's prediction band: the confidence that one live run meets it "
         "(0.95, the default: the 90% band's upper edge; 19 more replays per setting, by default only up to "
         "50,000 requests); 0: on the point estimate (one run at --seed).")]


def register(app) -> None:
    app.command()(sweep)


def progress_bar(total: int | None, what: str):
    """A rich progress bar on stderr (shown only on a terminal); returns (context, update)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True)
    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
                   disable=not console.is_terminal)
    task = bar.add_task(what, total=total)
    return bar, lambda done, _total: bar.update(task, completed=done)


def sweep(
    trace: Annotated[Path, typer.Argument(help="Request trace (as for schedsim run).")],
    grid: Grid = [],
    policy: o.Policy = "dynamic",
    slo: Slo = [],
    slo_p99_ms: SloP99 = None,
    objective: Annotated[str, typer.Option(help="max:KEY or min:KEY over summary.json metrics.")] = "max:throughput_rps",
    tie_tolerance: Annotated[float, typer.Option(help="Objective values within this fraction of the best tie; lower p99 wins.")] = 0.01,
    param: o.Param = [],
    max_batch_size: o.MaxBatchSize = None,
    profile: Profile = None,
    instances: o.Instances = None,
    rate_scale: o.RateScale = 1.0,
    warmup_s: o.WarmupS = 0.0,
    seed: Seed = 1,
    replications: Replications = 1,
    executor: Executor = "local",
    ray_address: RayAddress = None,
    workers: Workers = None,
    out: Annotated[Optional[Path], typer.Option(help="Write cells.csv (as cells finish), sweep.csv, best.json and plots here.")] = None,
    plot: Annotated[bool, typer.Option("--plot/--no-plot", help="With --out: p99/throughput against each swept number, Pareto front.")] = True,
    top: Annotated[int, typer.Option(help="Rows of the ranked table to print.")] = 15,
    slo_confidence: SloConfidence = None,
):
    """Run TRACE once per grid cell in parallel; rank the cells; recommend the best setting meeting the SLO."""
    from schedsim.planning.grid import parse_grid
    from schedsim.planning.objective import parse_objective, parse_slo
    from schedsim.run.outdir import prepare_out_dir
    from schedsim.run.spec import RunSpec
    from schedsim.planning.objective import band_level
    from schedsim.planning.sweep import SweepSpec, judged_on, run_command, run_sweep

    if out is not None:
        prepare_out_dir(out)
    grid_values = parse_grid(grid)
    slo_terms = parse_slo(slo, slo_p99_ms)
    if slo_confidence is not None:
        band_level(slo_confidence)  # a bad value is one line, before any work
    params = o.policy_params(max_batch_size=max_batch_size, preferred_batch_size=None, param=param)
    overlap = set(params) & set(grid_values)
    if overlap:
        raise InputError(f"--grid: {sorted(overlap)[0]} is also set as a fixed parameter")
    if executor == "ray" and ray_address:
        from schedsim.planning.executors import check_ray_address

        check_ray_address(ray_address)  # before any work
    spec = SweepSpec(
        base=RunSpec(trace=trace, policy=policy, params=params, profile=profile, instances=instances,
                     seed=seed, replications=replications, warmup_s=warmup_s, rate_scale=rate_scale),
        grid=grid_values, slo=slo_terms, objective=parse_objective(objective, tie_tolerance, slo_terms),
        executor=executor, workers=workers, ray_address=ray_address, out=out, plot=plot,
        slo_confidence=slo_confidence)
    from schedsim.planning.grid import cells

    bar, update = progress_bar(len(cells(grid_values)), "sweep")
    console = Console()
    try:
        with bar:
            outcome = run_sweep(spec, progress=update)
    except KeyboardInterrupt:
        if out is not None:
            console.print(f"interrupted: finished cells kept in {out / 'cells.csv'}; "
                          f"sweep.csv and best.json say complete: false")
        raise
    print_table(console, outcome, spec, top)
    if spec.slo:
        console.print(f"SLO judged on {judged_on(outcome.rows, spec.slo, spec.slo_confidence)}",
                      highlight=False, soft_wrap=True)
    for path in outcome.written:
        console.print(f"wrote {path}")
    if outcome.best is not None:
        print_best(console, outcome.best, spec, "best")
        console.print(f"reproduce: {run_command(outcome.best, spec)}", soft_wrap=True)
        return
    if not spec.slo:
        return
    closest = outcome.closest
    print_best(console, closest, spec, "closest")
    shown = ", ".join(f"{k}={closest[k]}" for k in spec.grid)
    values = ", ".join(f"{c.key} {closest.get(c.key):.4g}" for c in spec.slo if closest.get(c.key) is not None)
    raise InputError(f"--slo: no setting meets {' and '.join(map(str, spec.slo))}; closest: {shown} ({values})")


def _num(v, digits=3) -> str:
    return "-" if v is None or v != v else f"{v:,.{digits}f}"


def print_table(console: Console, outcome, spec, top: int) -> None:
    table = Table(title=f"{len(outcome.rows)} cells, ranked by {spec.objective}"
                  + (f" under {' and '.join(map(str, spec.slo))}" if spec.slo else ""),
                  box=None, header_style="bold")
    for name in ["#", *spec.grid, "req/s", "p99 ms", "p50 ms", "batch", "SLO"]:
        table.add_column(name, justify="right")
    for rank_, row in enumerate(outcome.rows[:top], 1):
        p99 = _num(row.get("p99_ms"))
        if row.get("p99_ms_ci_lo") is not None:
            p99 += f" ±{(row['p99_ms_ci_hi'] - row['p99_ms_ci_lo']) / 2:.3f}"
        table.add_row(str(rank_), *(str(row[n]) for n in spec.grid), _num(row.get("throughput_rps"), 1),
                      p99, _num(row.get("p50_ms")), _num(row.get("mean_batch_size"), 2),
                      ("yes" if row["meets_slo"] else "no") if spec.slo else "-")
    console.print(table)
    if len(outcome.rows) > top:
        console.print(f"... {len(outcome.rows) - top} more rows in sweep.csv" if spec.out else
                      f"... {len(outcome.rows) - top} more rows (--top to show them)")


def print_best(console: Console, row: dict, spec, what: str) -> None:
    shown = ", ".join(f"{k}={row[k]}" for k in spec.grid)
    parts = []
    for c in spec.slo:
        value = row.get(c.key)
        text = f"{c.key} {_num(value)} (margin {_num(c.margin(value))}"
        if row.get(f"{c.key}_ci_lo") is not None:
            text += f", 95% CI {_num(row[f'{c.key}_ci_lo'])}..{_num(row[f'{c.key}_ci_hi'])}"
        if row.get(f"{c.key}_hi") is not None:
            text += f", band {_num(row[f'{c.key}_lo'])}..{_num(row[f'{c.key}_hi'])}"
        parts.append(text + ")")
    parts.append(f"throughput {_num(row.get('throughput_rps'), 1)} req/s")
    head = "best setting meeting the SLO" if what == "best" else "no setting meets the SLO; closest"
    if not spec.slo:
        head = f"best by {spec.objective}"
    console.print(f"[bold]{head}:[/bold] {shown}: " + ", ".join(parts), soft_wrap=True)
