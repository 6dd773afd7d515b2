"""``schedsim plan`` (fewest GPUs meeting an SLO) and ``schedsim autoscale`` (an autoscaled
fleet against a fixed one). InputError propagates; the top-level CLI prints one line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from schedsim.cli import options as o
from schedsim.cli.sweep import (Executor, Grid, Profile, RayAddress, Replications, Seed, Slo, SloConfidence, SloP99,
                                Workers, progress_bar)
from schedsim.errors import InputError

# The commands import their implementation (the drivers, the simulator, numpy, pyarrow)
# inside their bodies: --help imports this module to list them, and those imports cost
# about 0.5 s that listing the commands does not need.

Router = Annotated[str, typer.Option(help="round-robin, least-outstanding, jsq, or module:Class / file.py:Class.")]
GpuCost = Annotated[float, typer.Option(help="Price of one GPU-hour (one replica per GPU).")]


def register(app) -> None:
    app.command()(plan)
    app.command()(autoscale)


def plan(
    qps: Annotated[float, typer.Option(help="Target request rate of the whole fleet (requests/s).")],
    slo: Slo = [],
    slo_p99_ms: SloP99 = None,
    trace: Annotated[Optional[Path], typer.Option(help="Trace whose shape to plan on (replayed at --qps).")] = None,
    arrival: Annotated[str, typer.Option(help="Without --trace: poisson or gamma arrivals at --qps.")] = "poisson",
    cv: Annotated[Optional[float], typer.Option(help="gamma: inter-arrival CV.")] = None,
    requests: Annotated[int, typer.Option(help="Without --trace: requests in the generated trace.")] = 50_000,
    policy: o.Policy = "dynamic",
    grid: Grid = [],
    param: o.Param = [],
    max_batch_size: o.MaxBatchSize = None,
    naive_policy: Annotated[str, typer.Option(help="Baseline planned the same way ('' for none).")] = "none",
    router: Annotated[Optional[str], typer.Option(help="Simulate the whole fleet behind this router (default: each replica gets QPS/N).")] = None,
    profile: Profile = None,
    instances: o.Instances = None,
    gpu_cost_per_hour: GpuCost = 2.5,
    max_replicas: Annotated[int, typer.Option(help="Give up above this many replicas.")] = 4096,
    warmup_s: o.WarmupS = 0.0,
    seed: Seed = 1,
    replications: Replications = 1,
    executor: Executor = "local",
    ray_address: RayAddress = None,
    workers: Workers = None,
    out: Annotated[Optional[Path], typer.Option(help="Write plan.json (and the generated trace) here.")] = None,
    slo_confidence: SloConfidence = None,
):
    """The fewest replicas (GPUs), and their settings, that meet the SLO at --qps; against no batching."""
    import tempfile

    from schedsim.files import write_json
    from schedsim.planning.grid import parse_grid
    from schedsim.planning.objective import Objective, band_level, parse_slo
    from schedsim.planning.plan import DEFAULT_GRIDS, PlanSpec, plan as make_plan, trace_for_plan
    from schedsim.run.outdir import prepare_out_dir
    from schedsim.run.spec import RunSpec

    if not qps > 0:
        raise InputError(f"--qps: {qps} is not valid; expected a number > 0")
    slo_terms = parse_slo(slo, slo_p99_ms)
    if not slo_terms:
        raise InputError("--slo-p99-ms / --slo: a plan needs an SLO to meet")
    if seed < 0:
        raise InputError(f"--seed: {seed} is not valid; expected an integer >= 0")
    if slo_confidence is not None:
        band_level(slo_confidence)  # a bad value is one line, before any work
    if out is not None:
        prepare_out_dir(out)
    grid_values = parse_grid(grid) if grid else DEFAULT_GRIDS.get(policy, {})
    params = o.policy_params(max_batch_size=max_batch_size, preferred_batch_size=None, param=param)
    if trace is not None and (cv is not None or arrival != "poisson"):
        raise InputError("--trace: give either --trace or --arrival/--cv, not both")
    with tempfile.TemporaryDirectory(prefix="schedsim-plan-") as tmp:
        path, rate, seq_len = trace_for_plan(trace, arrival, cv, requests, qps, seed, out or Path(tmp))
        upper = [c.key for c in slo_terms if c.op[0] == "<"]
        spec = PlanSpec(
            base=RunSpec(trace=path, policy=policy, params=params, profile=profile, instances=instances,
                         seed=seed, replications=replications, warmup_s=warmup_s,
                         # A generated trace stands for fresh traffic: the band redraws its arrivals too.
                         band_arrivals="fixed" if trace is not None else "resample"),
            qps=qps, trace_rate=rate, slo=slo_terms, grid=grid_values,
            # At a fixed load every stable setting serves it: the lowest tail wins.
            objective=Objective(upper[0] if upper else "p99_ms", "min", 0.0),
            naive_policy=naive_policy or None, router=router, max_replicas=max_replicas,
            gpu_cost_per_hour=gpu_cost_per_hour, executor=executor, workers=workers, ray_address=ray_address,
            slo_confidence=slo_confidence)
        bar, _ = progress_bar(None, "plan")
        task = bar.task_ids[0]
        with bar:
            result = make_plan(spec, seq_len, progress=lambda name, n, ok: bar.update(
                task, description=f"plan {name}: {n} replicas {'meet' if ok else 'miss'}"))
    result["trace"] = str(trace) if trace else f"generated: {arrival}, {requests} requests, seed {seed}"
    console = Console()
    table = Table(title=f"Fewest replicas for {qps:,g} req/s under {' and '.join(result['slo'])}",
                  box=None, header_style="bold")
    for col in ("policy", "replicas (GPUs)", "$/hour", "p99 ms", "batch", "one fewer"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for name, entry in result["plans"].items():
        if entry["replicas"] is None:
            table.add_row(name, f"> {max_replicas}", "-", "-", "-", "")
            continue
        m = entry["metrics"]
        fewer = entry.get("one_fewer")
        table.add_row(name, str(entry["replicas"]), f"{entry['cost_per_hour']:,.2f}", f"{m['p99_ms']:.3f}",
                      f"{m['mean_batch_size']:.2f}",
                      "-" if not fewer else (f"{fewer['replicas']}: misses" if not fewer["meets_slo"] else "meets?"))
    console.print(table)
    console.print(f"SLO judged on {result['slo_judged_on']}", highlight=False, soft_wrap=True)
    for name, entry in result["plans"].items():
        if entry.get("settings"):
            console.print(f"{name} settings: " + ", ".join(f"{k}={v}" for k, v in entry["settings"].items()))
    if "savings" in result:
        s, main = result["savings"], result["plans"][policy]
        console.print(f"{policy} needs {main['replicas']} GPUs where {naive_policy} needs "
                      f"{result['plans'][naive_policy]['replicas']}: {s['ratio']:.1f}x fewer, "
                      f"{s['cost_per_hour_saved']:,.2f}/hour saved")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "plan.json", result)
        console.print(f"wrote {out / 'plan.json'}")


def autoscale(
    trace: Annotated[Path, typer.Argument(help="Request trace, e.g. schedsim trace gen --arrival diurnal.")],
    policy: o.Policy = "dynamic",
    max_queue_delay_us: o.MaxQueueDelayUs = None,
    preferred_batch_size: o.PreferredBatchSize = None,
    max_batch_size: o.MaxBatchSize = None,
    param: o.Param = [],
    router: Router = "least-outstanding",
    min_replicas: Annotated[int, typer.Option(help="Fewest routable replicas.")] = 1,
    max_replicas: Annotated[int, typer.Option(help="Most replicas, starting ones included.")] = 8,
    initial_replicas: Annotated[Optional[int], typer.Option(help="Replicas at the start (default: --min-replicas).")] = None,
    scale_up_above: Annotated[float, typer.Option(help="Add a replica when utilisation stays above this ...")] = 0.8,
    scale_down_below: Annotated[float, typer.Option(help="... remove one when it stays below this ...")] = 0.3,
    window_s: Annotated[float, typer.Option(help="... for this long (seconds).")] = 300.0,
    interval_s: Annotated[float, typer.Option(help="Seconds between utilisation samples.")] = 10.0,
    cold_start_s: Annotated[float, typer.Option(help="Seconds from adding a replica to its first request (paid for).")] = 60.0,
    fixed_replicas: Annotated[Optional[int], typer.Option(help="Fixed fleet to compare with (default: --max-replicas).")] = None,
    slo_latency_ms: Annotated[float, typer.Option(help="SLO attainment = share of requests answered within this.")] = 50.0,
    gpu_cost_per_hour: GpuCost = 2.5,
    profile: Profile = None,
    instances: o.Instances = None,
    rate_scale: o.RateScale = 1.0,
    warmup_s: o.WarmupS = 0.0,
    seed: Seed = 1,
    out: Annotated[Optional[Path], typer.Option(help="Write autoscale.json, scaling_log.csv and autoscale.png here.")] = None,
    json_output: o.JsonOutput = False,
):
    """Replay TRACE on a fleet that grows and shrinks with utilisation; compare with a fixed fleet."""
    from schedsim.planning.autoscale import UtilizationAutoscaler, compare_with_fixed
    from schedsim.run.spec import RunSpec

    from schedsim.run.outdir import prepare_out_dir

    if seed < 0:
        raise InputError(f"--seed: {seed} is not valid; expected an integer >= 0")
    if out is not None:
        prepare_out_dir(out)
    auto = UtilizationAutoscaler(scale_up_above, scale_down_below, window_s, interval_s, cold_start_s,
                                 min_replicas, max_replicas)
    params = o.policy_params(max_batch_size=max_batch_size, preferred_batch_size=preferred_batch_size,
                             max_queue_delay_us=max_queue_delay_us, param=param)
    base = RunSpec(trace=trace, policy=policy, params=params, profile=profile, instances=instances,
                   seed=seed, warmup_s=warmup_s, rate_scale=rate_scale)
    result = compare_with_fixed(base, auto, router, initial_replicas or min_replicas,
                                fixed_replicas or max_replicas, slo_latency_ms)
    timeline = result.pop("_timeline")
    for name in ("autoscaled", "fixed"):
        result[name]["cost"] = result[name]["gpu_hours"] * gpu_cost_per_hour
    result["config"] = {"trace": str(trace), "policy": policy, "params": {k: str(v) for k, v in params.items()},
                        "router": router, "seed": seed, "gpu_cost_per_hour": gpu_cost_per_hour,
                        "autoscaler": {k: v for k, v in vars(auto).items() if k != "history"}}
    if json_output:
        o.print_json(result)
    else:
        console = Console()
        table = Table(title=f"Autoscaled ({min_replicas}..{max_replicas}) against "
                      f"{fixed_replicas or max_replicas} fixed replicas, {router}", box=None, header_style="bold")
        for col in ("fleet", "GPU-hours", "cost", f"within {slo_latency_ms:g} ms", "p99 ms", "p99.9 ms",
                    "replicas used"):
            table.add_column(col, justify="right")
        for name in ("autoscaled", "fixed"):
            r = result[name]
            table.add_row(name, f"{r['gpu_hours']:.4f}", f"{r['cost']:.4f}", f"{r['slo_attainment']:.2%}",
                          f"{r['p99_ms']:.3f}", f"{r['p999_ms']:.3f}", str(r["replicas_used"]))
        console.print(table)
        actions = [e for e in result["scaling_log"] if e["action"] != "ready"]
        console.print(f"scaling actions: {len(actions)} ("
                      + ", ".join(f"{e['action']} r{e['replica']} at {e['time_s']:.0f} s" for e in actions[:6])
                      + (", ..." if len(actions) > 6 else "") + ")")
    if out is not None:
        from schedsim.planning.autoscale_report import write_autoscale_outputs

        for path in write_autoscale_outputs(out, result, timeline, auto):
            if not json_output:
                Console().print(f"wrote {path}")
