"""``schedsim profile``: measure an engine into a cost table; ``show`` and ``compare`` tables.

    schedsim profile --model builtin:bert-tiny --backend onnxruntime --batch-sizes 1-8 \\
        --seq-lens 32 --out profiles/bert-tiny-ort-cpu.csv
    schedsim profile show profiles/bert-tiny-ort-cpu.csv --plot tiny.png
    schedsim profile compare A.csv B.csv --plot ratio.png
    schedsim profile llm --model builtin:llama-1b --dtype bf16 --out profiles/llama-1b-steps.csv

The measuring itself is :mod:`schedsim.profiling.profiler`; this module parses flags, draws the
progress bars and tables, and makes the plots. ``python -m schedsim.cli.profile`` runs
the same commands without the rest of the CLI (and so without the simulator's
dependencies), for machines that only measure.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from schedsim.cli.options import Cpu, int_list
from schedsim.errors import InputError
from schedsim.profiling.host import pin_cpu

# The commands import their implementation (the drivers, the simulator, numpy, pyarrow)
# inside their bodies: --help imports this module to list them, and those imports cost
# about 0.5 s that listing the commands does not need.

app = typer.Typer(help="Measure engines into cost tables; show and compare them.",
                  add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

_err = Console(stderr=True)


class _RichProgress:
    """A bar over all cells and a bar for the cell being measured."""

    def __init__(self, console: Console):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), console=console, transient=False)
        self._spec = None

    def __enter__(self):
        self._p.__enter__()
        return self

    def __exit__(self, *exc):
        self._p.__exit__(*exc)

    def start(self, cells, spec):
        self._spec = spec
        self._all = self._p.add_task("cells", total=len(cells))
        self._cell = self._p.add_task("", total=spec.min_iters)

    def cell_start(self, index, batch, seq_len):
        self._p.reset(self._cell, total=self._spec.min_iters,
                      description=f"batch {batch:>4} seq {seq_len:>4}")

    def cell_sample(self, n):
        self._p.update(self._cell, completed=min(n, self._spec.min_iters))

    def cell_done(self, index, batch, seq_len, stats):
        self._p.update(self._all, completed=index + 1)
        self._p.update(self._cell, description=(f"batch {batch:>4} seq {seq_len:>4}: "
                                                f"{stats['latency_ms_p50']:.3f} ms p50"))

    def note(self, text):
        self._p.console.print(text)


@app.callback(invoke_without_command=True)
def profile(
    ctx: typer.Context,
    model: Annotated[Optional[str], typer.Option(help="builtin:NAME (bert-base, bert-tiny, llama-1b, llama-tiny) or an .onnx file.")] = None,
    backend: Annotated[str, typer.Option(help="torch, onnxruntime, tensorrt or triton (through a Triton server: builtin:bert-tiny/bert-base, --device cpu or cuda).")] = "torch",
    precision: Annotated[str, typer.Option(help="fp32, fp16, bf16 or int8.")] = "fp32",
    batch_sizes: Annotated[str, typer.Option(help="Sizes and ranges, e.g. 1,2,4-64.")] = "1,2,4,8,16,32,64",
    seq_lens: Annotated[Optional[str], typer.Option(help="Sequence lengths, e.g. 128,384 (default 128; an .onnx model whose inputs have no dynamic sequence axis: its own fixed size).")] = None,
    cuda_graphs: Annotated[bool, typer.Option("--cuda-graphs", help="Replay one CUDA graph per shape (torch, tensorrt).")] = False,
    compile: Annotated[bool, typer.Option("--compile", help="torch.compile the module (torch).")] = False,
    instances: Annotated[int, typer.Option(help="Runners measured at once on one device, one stream each.")] = 1,
    warmup_ms: Annotated[float, typer.Option(help="Warm-up per cell, ms.")] = 200.0,
    min_iters: Annotated[int, typer.Option(help="Timed batches per cell, at least.")] = 10,
    min_time_s: Annotated[float, typer.Option(help="Timed seconds per cell, at least.")] = 3.0,
    max_cell_s: Annotated[Optional[float], typer.Option(help="Stop a cell's sampling after this long (flagged truncated).")] = None,
    device: Annotated[Optional[str], typer.Option(help="torch: cuda, cuda:N or cpu (default: cuda if available).")] = None,
    provider: Annotated[Optional[str], typer.Option(help="onnxruntime: cpu, cuda, tensorrt or a provider's full name.")] = None,
    tf32: Annotated[bool, typer.Option("--tf32", help="torch fp32: allow TF32 matrix products.")] = False,
    workspace_gib: Annotated[float, typer.Option(help="tensorrt: workspace memory-pool limit, GiB.")] = 4.0,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Exported ONNX files and TensorRT engines (default ~/.cache/schedsim).")] = None,
    dispatch_iters: Annotated[int, typer.Option(help="Batches in the dispatch-overhead loop (0 skips it).")] = 300,
    power_cap_s: Annotated[float, typer.Option(help="Seconds per phase of the power-cap measurement: how a batch slows after heavy ones on a power-capped GPU (7 phases; 0 skips it; try 2 on a GPU).")] = 0.0,
    host_variation_s: Annotated[float, typer.Option(help="Seconds per round of the host-variation measurement: how the host's speed moves between and within runs, for prediction bands (5 rounds of the smallest cell; 0 skips it; try 2).")] = 0.0,
    pair_s: Annotated[float, typer.Option(help="With --instances 2: seconds per pair of batch sizes in the pair-slowdown grid, how much a batch slows beside the other instance's batch of another size (0 skips it; try 0.3 on a GPU).")] = 0.0,
    pair_batches: Annotated[Optional[str], typer.Option(help="Batch sizes of the pair grid (default: the powers of two measured, and the largest; triton: 1, 8, 32 and the largest on cuda, none on cpu; 'none' skips).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for weights and inputs.")] = 0,
    cpu: Cpu = None,
    triton_batches: Annotated[int, typer.Option(help="triton: measured executions per batch size.")] = 200,
    triton_warmup_batches: Annotated[int, typer.Option(help="triton: executions per size before measuring.")] = 20,
    triton_depth: Annotated[int, typer.Option(help="triton: batches in flight per size (depth x b clients), so the server never idles.")] = 2,
    triton_trace: Annotated[bool, typer.Option("--triton-trace/--no-triton-trace", help="triton: per-batch samples from Triton's trace (one request in b).")] = True,
    triton_zero_delay_requests: Annotated[int, typer.Option(help="triton: sequential single requests for the zero-delay queue and request-path terms (0 skips).")] = 200,
    triton_protocol: Annotated[str, typer.Option(help="triton: how the clients reach the server, http or grpc; http (the default) sends the same requests as schedsim live --backend triton (aiohttp, binary output).")] = "http",
    triton_wake_requests: Annotated[int, typer.Option(help="triton: lone requests per pause for the wake curve (what idling costs an instance; 0 skips).")] = 30,
    triton_arrivals: Annotated[str, typer.Option(help="triton: closed (full batches back to back) or open (each size also under a Poisson stream at --triton-open-load of its throughput, requests arriving while batches run; the table from that).")] = "closed",
    triton_open_load: Annotated[float, typer.Option(help="triton: with --triton-arrivals open, the stream's rate as a fraction of each size's closed-loop throughput.")] = 0.9,
    triton_host_servers: Annotated[int, typer.Option(help="triton: with --host-variation-s, also start this many fresh servers one after another, one round each, so the record's between-runs figure is between servers (each live run starts its own); 0: rounds of the table's server.")] = 0,
    out: Annotated[Optional[Path], typer.Option(help="Profile CSV to write (sidecar and samples go next to it).")] = None,
):
    """Measure a model on a backend into a cost table (CSV + JSON sidecar + raw samples)."""
    if ctx.invoked_subcommand is not None:
        return
    if backend == "triton":
        from schedsim.profiling.profiler import parse_sizes
        from schedsim.triton.profiling import TritonProfileSpec, run_triton_profile

        if model is None or out is None:
            raise InputError("--model and --out are required (or use: schedsim profile show/compare/import)")
        seqs = parse_sizes(seq_lens or "128", "--seq-lens")
        if len(seqs) != 1:
            raise InputError(f"--seq-lens {seq_lens}: --backend triton measures one seq_len")
        spec = TritonProfileSpec(
            model=model, batch_sizes=parse_sizes(batch_sizes, "--batch-sizes"), seq_len=seqs[0], device=device,
            precision=None if precision == "fp32" and device != "cuda" else precision, cuda_graphs=cuda_graphs,
            batches=triton_batches, warmup_batches=triton_warmup_batches, depth=triton_depth, trace=triton_trace,
            zero_delay_requests=triton_zero_delay_requests, protocol=triton_protocol, seed=seed,
            wake_requests=triton_wake_requests, warmup_s=warmup_ms / 1e3, min_time_s=min_time_s,
            arrivals=triton_arrivals, open_load=triton_open_load, host_variation_s=host_variation_s,
            host_servers=triton_host_servers, pair_sizes=int_list(pair_batches, "--pair-batches"))
        outcome = run_triton_profile(spec, out, note=lambda text: _err.print(text, highlight=False))
        for w in outcome.warnings:
            _err.print(f"[yellow]warning:[/yellow] {w}", highlight=False, soft_wrap=True)
        if outcome.path is None:
            raise typer.Exit(1)
        print(f"wrote {outcome.path} ({outcome.sizes} batch sizes through Triton)")
        return
    from schedsim.profiling.profiler import Interrupted, ProfileSpec, parse_sizes, run_profile

    if model is None or out is None:
        raise InputError("--model and --out are required (or use: schedsim profile show/compare)")
    spec = ProfileSpec(
        model=model, backend=backend, precision=precision,
        batch_sizes=parse_sizes(batch_sizes, "--batch-sizes"),
        seq_lens=model_seq_lens(model, backend, seq_lens), cuda_graphs=cuda_graphs, compile=compile,
        instances=instances, warmup_ms=warmup_ms, min_iters=min_iters, min_time_s=min_time_s,
        max_cell_s=max_cell_s, device=device, provider=provider, tf32=tf32,
        workspace_gib=workspace_gib, cache_dir=str(cache_dir) if cache_dir else None,
        dispatch_iters=dispatch_iters, power_cap_s=power_cap_s, pair_s=pair_s, host_variation_s=host_variation_s,
        pair_batches=parse_sizes(pair_batches, "--pair-batches") if pair_batches else None, seed=seed, cpu=cpu)
    try:
        # Bars only on a terminal: piped stderr keeps errors to their one line.
        with (_RichProgress(_err) if _err.is_terminal else contextlib.nullcontext()) as bar:
            outcome = run_profile(spec, out, bar)
    except Interrupted as exc:
        o = exc.outcome
        kept = (f"kept {o.cells} cells in {o.path} (marked partial)" if o.path
                else "no complete batch row was measured, nothing written")
        print(f"schedsim: interrupted: {kept}", file=sys.stderr)
        raise typer.Exit(130) from None
    for w in outcome.warnings:
        _err.print(f"[yellow]warning:[/yellow] {w}", highlight=False, soft_wrap=True)
    print(f"wrote {outcome.path} ({outcome.cells} cells)")


def model_seq_lens(model: str, backend: str, seq_lens: str | None) -> tuple:
    """``--seq-lens`` as sizes; for an .onnx file none of whose inputs has a dynamic sequence
    axis (an MLP taking [batch, 256]), the model's own fixed size, said on stderr."""
    from schedsim.profiling.profiler import parse_sizes

    if model.startswith("builtin:") or backend not in ("onnxruntime", "tensorrt") or not Path(model).is_file():
        return parse_sizes(seq_lens or "128", "--seq-lens")
    from schedsim.live.engines.onnx_export import inspect_onnx

    inputs = inspect_onnx(model).inputs
    if any(spec.seq_axis is not None for spec in inputs):
        return parse_sizes(seq_lens or "128", "--seq-lens")
    fixed = sorted({spec.dims[1] for spec in inputs if len(spec.dims) > 1})
    shapes = ", ".join(f"{spec.name!r} {['batch', *spec.dims[1:]]}" for spec in inputs)
    if seq_lens is not None and parse_sizes(seq_lens, "--seq-lens") != tuple(fixed[:1]):
        raise InputError(f"--seq-lens {seq_lens}: {model} has no dynamic sequence axis (inputs {shapes}); "
                         "its dimensions after the batch are fixed: leave --seq-lens out")
    if len(fixed) > 1:
        raise InputError(f"{model}: inputs {shapes} have different fixed sizes after the batch axis; "
                         "schedsim profiles one size per cell")
    size = fixed[0] if fixed else 1
    _err.print(f"note: {model}: no dynamic sequence axis (inputs {shapes}); profiling batch sizes only, "
               f"recorded as seq_len {size}", highlight=False, soft_wrap=True)
    return (size,)


# -- llm -------------------------------------------------------------------------------

class _RichStepProgress:
    """One bar per phase of the step profiler (prepare, warm-up, sampling, swap)."""

    def __init__(self, console: Console):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TextColumn("{task.fields[text]}"),
                           console=console, transient=False)
        self._task = None

    def __enter__(self):
        self._p.__enter__()
        return self

    def __exit__(self, *exc):
        self._p.__exit__(*exc)

    def phase(self, name, total):
        self._task = self._p.add_task(name, total=total, text="")

    def update(self, completed, text=""):
        self._p.update(self._task, completed=completed, text=text)

    def note(self, text):
        self._p.console.print(text)


@app.command("llm")
def llm(
    model: Annotated[str, typer.Option(help="builtin:llama-1b or builtin:llama-tiny (random weights), or their speculative-decoding drafts builtin:llama-1b-draft, builtin:llama-tiny-draft.")] = "builtin:llama-1b",
    dtype: Annotated[str, typer.Option(help="bf16, fp16 or fp32.")] = "bf16",
    device: Annotated[Optional[str], typer.Option(help="cuda, cuda:N or cpu (default: cuda if available).")] = None,
    cuda_graphs: Annotated[bool, typer.Option("--cuda-graphs/--no-cuda-graphs", help="Replay decode-only steps as CUDA graphs.")] = True,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    max_context: Annotated[int, typer.Option(help="Leave out steps whose longest request exceeds this many tokens.")] = 196608,
    quick: Annotated[bool, typer.Option("--quick", help="A small grid and short sampling (a smoke test).")] = False,
    min_samples: Annotated[Optional[int], typer.Option(help="Samples per step composition to aim for (default 15; 5 with --quick).")] = None,
    max_time_s: Annotated[Optional[float], typer.Option(help="Cap on the sampling rounds, s (default 240; 3 with --quick).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for weights, token ids and the visiting order.")] = 0,
    warm_shapes: Annotated[bool, typer.Option("--warm-shapes", help="Time steps with a prefill chunk at their nominal length, warm (run before). Default: each sample moves the chunk a few tokens, to a step length the engine has not run yet, as a server meets new prompt lengths.")] = False,
    host_variation_s: Annotated[float, typer.Option(help="Seconds per round of the host-variation measurement: how the host's speed moves between and within runs, for the LLM prediction band (5 rounds of the cheapest step; 0 skips it; try 2).")] = 0.0,
    cpu: Cpu = None,
    out: Annotated[Optional[Path], typer.Option(help="Step-profile CSV to write (the JSON sidecar goes next to it).")] = None,
):
    """Measure LLM engine steps (prefill chunks, decodes, mixed) into a step profile."""
    from schedsim.profiling.step_profiler import PlainStepProgress, run_step_profile, spec_from_flags
    from schedsim.profiling.profiler import Interrupted

    if out is None:
        raise InputError("--out is required: the step-profile CSV to write")
    spec = spec_from_flags(
        model=model, dtype=dtype, device=device, cuda_graphs=cuda_graphs, block_size=block_size,
        max_context=max_context, quick=quick, min_samples=min_samples, max_time_s=max_time_s,
        seed=seed, fresh_shapes=not warm_shapes, host_variation_s=host_variation_s)
    pinning = pin_cpu(cpu)   # before the engine's torch and CUDA threads start (they inherit it)
    try:
        with (_RichStepProgress(_err) if _err.is_terminal
              else contextlib.nullcontext(PlainStepProgress())) as bar:
            outcome = run_step_profile(spec, out, bar, cpu_pinning=pinning)
    except Interrupted as exc:
        o = exc.outcome
        kept = (f"kept {o.cells} compositions in {o.path} (marked partial)" if o.path
                else "no composition was sampled, nothing written")
        print(f"schedsim: interrupted: {kept}", file=sys.stderr)
        raise typer.Exit(130) from None
    for w in outcome.warnings:
        _err.print(f"[yellow]warning:[/yellow] {w}", highlight=False, soft_wrap=True)
    print(f"wrote {outcome.path} ({outcome.cells} step compositions)")


# -- import ----------------------------------------------------------------------------

@app.command("import")
def import_stats(
    source: Annotated[str, typer.Argument(help="Triton's statistics: the JSON of /v2/models[/NAME]/stats, or a server URL (http://HOST:PORT or HOST:PORT).")],
    model: Annotated[Optional[str], typer.Option(help="The model to import (needed when the statistics hold several).")] = None,
    version: Annotated[Optional[str], typer.Option(help="The model version (needed when several versions have statistics).")] = None,
    timeout_s: Annotated[float, typer.Option(help="Seconds to wait for a server's answer.")] = 10.0,
    out: Annotated[Optional[Path], typer.Option(help="Profile CSV to write (the JSON sidecar goes next to it).")] = None,
):
    """Turn a Triton server's statistics (batch_stats) into a cost table: one row per executed batch size."""
    from schedsim.triton.stats import import_profile

    if out is None:
        raise InputError("--out is required: the profile CSV to write")
    prof, warnings = import_profile(source, out, model=model, version=version, timeout_s=timeout_s)
    for w in warnings:
        _err.print(f"[yellow]warning:[/yellow] {w}", highlight=False, soft_wrap=True)
    n = prof.columns["n"]
    print(f"wrote {out} ({len(n)} batch sizes {_ranges(prof.batches.tolist())}, {int(n.sum()):,} executions "
          f"of {prof.meta['model']}; spread unknown: every batch takes its size's mean)")


# -- show ------------------------------------------------------------------------------

def _load(path: Path):
    from schedsim.cost.profile import load_profile

    return load_profile(path)


def _throughput(prof) -> np.ndarray:
    """Samples per second of each row: instances x batch / mean latency."""
    k = int(prof.meta.get("instances", 1) or 1)
    t = prof.table
    return k * t["batch"].to_numpy() / t["latency_ms_mean"].to_numpy() * 1e3


def _provenance(prof) -> str:
    m = prof.meta
    parts = [m.get("model", "?"), f"{m.get('backend', '?')} {m.get('backend_version', '')}".strip(),
             m.get("precision", "?"), "CUDA graphs" if m.get("cuda_graphs") else "",
             "compiled" if m.get("compile") else "",
             f"{m['instances']} instances" if m.get("instances", 1) > 1 else "",
             m.get("device", "?"), m.get("date", "")]
    return ", ".join(p for p in parts if p)


@app.command()
def show(
    path: Annotated[Path, typer.Argument(help="Profile CSV.")],
    plot: Annotated[Optional[Path], typer.Option(help="Write latency and throughput vs batch to this PNG.")] = None,
):
    """Print a profile's table and provenance; optionally plot latency and throughput vs batch."""
    if plot is not None:
        from schedsim.run.outdir import check_out_file

        check_out_file(plot, "--plot", create_parent=True)
    prof = _load(path)
    console = Console()
    console.print(f"[bold]{path}[/bold]: {_provenance(prof)}", highlight=False)
    if prof.meta.get("partial"):
        console.print(f"[bold red]PARTIAL PROFILE[/bold red]: missing cells "
                      f"{', '.join(prof.meta.get('missing_cells', [])[:8])}"
                      f"{' ...' if len(prof.meta.get('missing_cells', [])) > 8 else ''}")
    t = prof.table
    tput = _throughput(prof)
    has_gpu = "gpu_ms_mean" in t.columns
    table = Table(box=None, header_style="bold")
    for col in ["batch"] + (["seq_len"] if prof.has_seq_len else []) + \
            ["n", "mean ms", "p50 ms", "p99 ms", "std/mean"] + (["GPU ms"] if has_gpu else []) + \
            ["samples/s"]:
        table.add_column(col, justify="right")
    for i, row in t.iterrows():
        cells = [str(int(row["batch"]))] + ([str(int(row["seq_len"]))] if prof.has_seq_len else []) + [
            str(int(row["n"])), f"{row['latency_ms_mean']:.3f}", f"{row['latency_ms_p50']:.3f}",
            f"{row['latency_ms_p99']:.3f}", f"{row['latency_ms_std'] / row['latency_ms_mean']:.3f}"]
        if has_gpu:
            cells.append(f"{row['gpu_ms_mean']:.3f}")
        cells.append(f"{tput[i]:,.0f}")
        table.add_row(*cells)
    console.print(table)
    if "dispatch_overhead_us" in prof.meta:
        console.print(f"dispatch overhead: {prof.meta['dispatch_overhead_us']:.1f} us per batch")
    if prof.meta.get("power_cap"):
        from schedsim.cost.power import PowerCap

        cap = PowerCap.from_meta(prof.meta, str(path))
        factors = ", ".join(f"{f:.3f} (b{b:g})" for b, f in zip(cap.batch, cap.factor))
        console.print(f"power cap ({cap.table} table): after back-to-back batches a batch takes x {factors}; "
                      f"clock time constants {cap.tau_rise_ns / 1e6:g} ms up, {cap.tau_fall_ns / 1e6:g} ms down",
                      highlight=False, soft_wrap=True)
    if prof.meta.get("pair_slowdown"):
        from schedsim.core.contention import PairSlowdown

        pairs = PairSlowdown.from_meta(prof.meta, str(path))
        lo, hi = pairs.batch[0], pairs.batch[-1]
        console.print(f"pair slowdown ({len(pairs.batch)} sizes, {lo}..{hi}): beside the other instance's batch, "
                      f"b{hi} beside b{lo} takes x {pairs.slowdown(hi, lo):.2f}, b{lo} beside b{hi} x "
                      f"{pairs.slowdown(lo, hi):.2f}, b{hi} beside b{hi} x {pairs.slowdown(hi, hi):.2f}",
                      highlight=False, soft_wrap=True)
    for w in prof.meta.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {w}", highlight=False, soft_wrap=True)
    if plot is not None:
        _plot_show(prof, path, plot)
        console.print(f"wrote {plot}")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_show(prof, path: Path, out: Path) -> None:
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    t = prof.table
    tput = _throughput(prof)
    for s in prof.seq_lens.tolist():
        m = (t["seq_len"] == s).to_numpy()
        label = f"seq {s}" if s else "latency"
        ax1.plot(t["batch"][m], t["latency_ms_p50"][m], marker=".", label=f"{label} p50")
        ax1.fill_between(t["batch"][m], t["latency_ms_p50"][m], t["latency_ms_p99"][m], alpha=0.2)
        ax2.plot(t["batch"][m], tput[m], marker=".", label=label)
    ax1.set(xlabel="batch size", ylabel="latency per batch, ms (p50, band to p99)",
            title="latency")
    ax2.set(xlabel="batch size", ylabel="samples/s", title="throughput")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{path.name}: {_provenance(prof)}", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


# -- compare ---------------------------------------------------------------------------

def compare_tables(a, b):
    """Cells both profiles measured: batch, seq_len, mean A, mean B, ratio B/A (sorted)."""
    import pandas as pd

    cols = ["batch", "seq_len", "latency_ms_mean", "latency_ms_p99"]
    m = pd.merge(a.table[cols], b.table[cols], on=["batch", "seq_len"], suffixes=("_a", "_b"))
    if m.empty:
        raise InputError(f"{b.source}: no (batch, seq_len) cell in common with {a.source}")
    m["ratio_b_over_a"] = m["latency_ms_mean_b"] / m["latency_ms_mean_a"]
    return m.sort_values(["seq_len", "batch"]).reset_index(drop=True)


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(help="Profile CSV A.")],
    b: Annotated[Path, typer.Argument(help="Profile CSV B.")],
    plot: Annotated[Optional[Path], typer.Option(help="Write B/A latency ratio vs batch to this PNG.")] = None,
):
    """Side by side: mean latency of A and B per cell, B/A, and which is faster where."""
    if plot is not None:
        from schedsim.run.outdir import check_out_file

        check_out_file(plot, "--plot", create_parent=True)
    pa, pb = _load(a), _load(b)
    m = compare_tables(pa, pb)
    console = Console()
    console.print(f"[bold]A[/bold] {a}: {_provenance(pa)}", highlight=False)
    console.print(f"[bold]B[/bold] {b}: {_provenance(pb)}", highlight=False)
    for p, name in ((pa, "A"), (pb, "B")):
        if p.meta.get("partial"):
            console.print(f"[bold red]{name} is a PARTIAL PROFILE[/bold red]")
    table = Table(box=None, header_style="bold")
    for col in ("batch", "seq_len", "A mean ms", "B mean ms", "B/A", "faster"):
        table.add_column(col, justify="right")
    for _, r in m.iterrows():
        ratio = r["ratio_b_over_a"]
        faster = "B" if ratio < 0.98 else "A" if ratio > 1.02 else "~"
        table.add_row(str(int(r["batch"])), str(int(r["seq_len"])), f"{r['latency_ms_mean_a']:.3f}",
                      f"{r['latency_ms_mean_b']:.3f}", f"{ratio:.3f}", faster)
    console.print(table)
    for s, g in m.groupby("seq_len"):
        r = g["ratio_b_over_a"].to_numpy()
        gm = float(np.exp(np.log(r).mean()))
        a_wins = g["batch"][r > 1.02].tolist()
        b_wins = g["batch"][r < 0.98].tolist()
        console.print(f"seq_len {s}: B/A geometric mean {gm:.3f} (min {r.min():.3f} at batch "
                      f"{int(g['batch'].iloc[r.argmin()])}, max {r.max():.3f} at batch "
                      f"{int(g['batch'].iloc[r.argmax()])}); A faster (>2%) at "
                      f"{_ranges(a_wins) or 'none'}; B faster at {_ranges(b_wins) or 'none'}",
                      highlight=False)
    if plot is not None:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(7, 4))
        for s, g in m.groupby("seq_len"):
            ax.plot(g["batch"], g["ratio_b_over_a"], marker=".", label=f"seq {s}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xlabel="batch size", ylabel="mean latency B / A", title=f"B = {b.name} over A = {a.name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot, dpi=120)
        plt.close(fig)
        console.print(f"wrote {plot}")


def _ranges(values) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1-3, 7, 9-10'."""
    out, vals = [], sorted(int(v) for v in values)
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ", ".join(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m schedsim.cli.profile``: the same commands and error handling as ``schedsim profile``."""
    try:
        app(args=argv, prog_name="schedsim profile", standalone_mode=False)
    except InputError as exc:
        print(f"schedsim: error: {exc}", file=sys.stderr)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("schedsim: aborted", file=sys.stderr)
        return 130
    except Exception as exc:
        import click

        if isinstance(exc, click.ClickException):
            print(f"schedsim: error: {' '.join(exc.format_message().split())}", file=sys.stderr)
            return exc.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
