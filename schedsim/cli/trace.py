"""``schedsim trace ...``: generate, inspect and download request traces.

InputError propagates; the top-level CLI prints it as ``schedsim: error: ...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import typer

from schedsim.errors import InputError

# The commands import their implementation (the drivers, the simulator, numpy, pyarrow)
# inside their bodies: --help imports this module to list them, and those imports cost
# about 0.5 s that listing the commands does not need.

app = typer.Typer(help="Generate, inspect and download request traces.", no_args_is_help=True, rich_markup_mode=None)


def _fmt(x: float, digits: int = 3) -> str:
    if x != x:  # NaN
        return "-"
    return f"{x:,.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


@app.command()
def gen(
    out: Path = typer.Option(..., "--out", help="Output file: .csv, .parquet or .pq."),
    seed: int = typer.Option(..., "--seed", help="Seed for numpy's default_rng; same seed, same trace."),
    arrival: str = typer.Option("poisson", "--arrival", help="poisson, gamma, onoff or diurnal."),
    rate: float = typer.Option(..., "--rate", help="Requests/s (onoff: during on periods; diurnal: mean)."),
    cv: Optional[float] = typer.Option(None, "--cv", help="gamma: inter-arrival CV (1 = Poisson)."),
    burstiness: Optional[float] = typer.Option(None, "--burstiness", help=(
        "gamma, as `vllm bench serve` says it: the gamma shape (1 = Poisson, < 1 burstier); CV = 1/sqrt(burstiness).")),
    on_s: Optional[float] = typer.Option(None, "--on-s", help="onoff: length of on periods, s."),
    off_s: Optional[float] = typer.Option(None, "--off-s", help="onoff: length of off periods, s."),
    rate_off: float = typer.Option(0.0, "--rate-off", help="onoff: rate during off periods."),
    amplitude: Optional[float] = typer.Option(None, "--amplitude", help="diurnal: relative swing, 0..1."),
    period_s: Optional[float] = typer.Option(None, "--period-s", help="diurnal: period, s."),
    n: Optional[int] = typer.Option(None, "--n", help="Number of requests."),
    duration_s: Optional[float] = typer.Option(None, "--duration-s", help="Or: generate for this long, s."),
    batch: Optional[str] = typer.Option(None, "--batch", help="Samples per request, e.g. fixed:1, uniform:1:8."),
    seq_len: Optional[str] = typer.Option(None, "--seq-len", help="Sequence length spec."),
    input_tokens: Optional[str] = typer.Option(None, "--input-tokens", help="Prompt tokens, e.g. lognormal:1000:1."),
    output_tokens: Optional[str] = typer.Option(None, "--output-tokens", help="Output tokens spec."),
) -> None:
    """Write a synthetic trace and print a one-line summary."""
    from schedsim.traces.generate import generate, parse_length
    from schedsim.run.outdir import check_out_file
    from schedsim.traces.io import save_trace, trace_stats

    if (n is None) == (duration_s is None):
        raise InputError("trace gen: give exactly one of --n or --duration-s")
    if seed < 0:
        raise InputError(f"--seed: {seed} is not valid; expected an integer >= 0")
    if n is not None and n < 1:
        raise InputError(f"--n: {n} is not valid; expected an integer >= 1 (a trace needs a request)")
    if cv is not None and arrival != "gamma":
        raise InputError(f"--cv: applies to --arrival gamma; {arrival} arrivals have no CV to set")
    check_out_file(out, "--out")
    if burstiness is not None:
        if cv is not None or arrival != "gamma":
            raise InputError("--burstiness: goes with --arrival gamma and instead of --cv")
        if not burstiness > 0:
            raise InputError(f"--burstiness: {burstiness} is not valid; expected a number > 0")
        cv = 1.0 / float(np.sqrt(burstiness))
    lengths = {col: parse_length(spec, col, name=flag) if spec is not None else None
               for col, flag, spec in (("batch", "--batch", batch), ("seq_len", "--seq-len", seq_len),
                                       ("input_tokens", "--input-tokens", input_tokens),
                                       ("output_tokens", "--output-tokens", output_tokens))}
    params = {"rate": rate, "cv": cv, "on_s": on_s, "off_s": off_s, "amplitude": amplitude,
              "period_s": period_s}
    if arrival == "onoff":
        params["rate_off"] = rate_off
    trace = generate(arrival, rng=np.random.default_rng(seed), n=n, duration_s=duration_s,
                     **lengths, **params)
    trace.meta["seed"] = seed
    save_trace(trace, out)
    s = trace_stats(trace)
    typer.echo(f"wrote {s['requests']:,} requests over {s['span_s']:.1f} s "
               f"(mean {_fmt(s['mean_rate'])} req/s, inter-arrival CV {_fmt(s['interarrival_cv'])}) to {out}")


@app.command()
def info(path: Path = typer.Argument(..., help="Trace file (schedsim CSV/Parquet, Azure CSV, Mooncake JSONL).")) -> None:
    """Summarise a trace: size, span, rate, burstiness and per-column statistics."""
    from rich.console import Console
    from rich.table import Table

    from schedsim.traces.io import load_trace, trace_stats

    trace = load_trace(path)
    s = trace_stats(trace)
    table = Table(title=f"{path} ({trace.meta.get('format', 'trace')})")
    table.add_column("figure")
    for name in ("mean", "median", "max"):
        table.add_column(name, justify="right")
    table.add_row("requests", f"{s['requests']:,}", "", "")
    table.add_row("span s", f"{s['span_s']:,.1f}", "", "")
    table.add_row("mean req/s", _fmt(s["mean_rate"]), "", "")
    table.add_row("inter-arrival CV", _fmt(s["interarrival_cv"]), "", "")
    for col, st in s["columns"].items():
        table.add_row(col, _fmt(st["mean"]), _fmt(st["median"]), f"{st['max']:,}")
    Console(width=100).print(table)


@app.command()
def download(
    name: str = typer.Argument(..., help="azure-code, azure-conv or mooncake-conversation."),
    dir: Path = typer.Option(Path("traces"), "--dir", help="Directory to save into."),
    print_only: bool = typer.Option(False, "--print-only", help="Print the URL and sha256; download nothing."),
) -> None:
    """Fetch a public trace and check its sha256."""
    from schedsim.traces.io import PUBLIC_TRACES, fetch_public_trace

    if name not in PUBLIC_TRACES:
        raise InputError(f"trace {name!r}: unknown; choose one of {', '.join(PUBLIC_TRACES)}")
    url, filename, sha = PUBLIC_TRACES[name]
    if print_only:
        typer.echo(f"{url}\nsha256 {sha}\nsave as {dir / filename}")
        return
    path = fetch_public_trace(name, dir)
    typer.echo(f"{path}: sha256 ok")
    if name.startswith("azure"):
        typer.echo("Azure LLM inference trace 2023, Microsoft Azure, CC-BY-4.0")


@app.command("import")
def import_triton(
    paths: list[Path] = typer.Argument(..., help="Triton trace file(s) written with --trace-config level=TIMESTAMPS (FILE.0, FILE.1, ... with log-frequency)."),
    out: Path = typer.Option(..., "--out", help="Output file: .csv, .parquet or .pq."),
    model: Optional[str] = typer.Option(None, "--model", help="The model whose requests to keep (needed when the trace holds several)."),
) -> None:
    """Turn Triton's per-request trace into an arrival trace, with the server's own times as extra columns."""
    from schedsim.traces.io import trace_stats
    from schedsim.triton.trace_import import read_triton_trace, save_triton_trace

    tt = read_triton_trace(paths, model=model)
    for w in tt.warnings:
        typer.echo(f"warning: {w}", err=True)
    save_triton_trace(tt, out)
    s = trace_stats(tt.trace)
    lat = tt.extra["server_latency_us"]
    served = lat[~np.isnan(lat)]
    typer.echo(f"wrote {s['requests']:,} requests of {tt.trace.meta['model']} over {s['span_s']:.3f} s "
               f"(mean {_fmt(s['mean_rate'])} req/s) to {out}; in {int(tt.extra['execution'].max()) + 1:,} "
               f"executions; server latency median {_fmt(float(np.median(served)) / 1e3) if served.size else '-'} ms")
