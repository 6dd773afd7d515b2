"""The ``schedsim`` command.

Every :class:`~schedsim.errors.InputError` and every usage error becomes one line on
stderr (``schedsim: error: ...``) and exit status 2, with no traceback.
"""

import ctypes
import gc
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from schedsim.cli import options as o
from schedsim.cli.coercion import PlainCommand, PlainParams
from schedsim.errors import InputError
from schedsim.run.spec import RunSpec


# Subcommands other than ``run`` live in their own modules, imported only when their
# command runs (or help lists them), so ``schedsim run`` does not pay for them.
# lazy: each pulls in the simulator, and live/profile the engines and profilers as well.
def _mount_live(sub: typer.Typer) -> None:
    from schedsim.cli import live as cli_live

    cli_live.register(sub)


def _mount_sweep(sub: typer.Typer) -> None:
    from schedsim.cli import plan as cli_plan, sweep as cli_sweep

    cli_sweep.register(sub)  # sweep
    cli_plan.register(sub)   # plan, autoscale


def _mount_trace(sub: typer.Typer) -> None:
    from schedsim.cli.trace import app as trace_app

    sub.add_typer(trace_app, name="trace", help="Make, inspect and download request traces.")


def _mount_profile(sub: typer.Typer) -> None:
    from schedsim.cli import profile as cli_profile

    sub.add_typer(cli_profile.app, name="profile", help="Measure engines into cost tables; show and compare them.")


# Listing order (as before: live ... autoscale, then run, then the groups); "run" stands
# for the commands defined in this module.
_LAZY_BEFORE = {"live": _mount_live, "validate": _mount_live, "sweep": _mount_sweep, "plan": _mount_sweep,
                "autoscale": _mount_sweep}
_LAZY_AFTER = {"trace": _mount_trace, "profile": _mount_profile}


class _LazyCommands(MutableMapping):
    """The top-level group's commands: the lazy ones are built on first lookup."""

    def __init__(self, eager: dict):
        self._loaders: dict[str, Callable[[typer.Typer], None]] = {**_LAZY_BEFORE, **_LAZY_AFTER}
        self._commands: dict = {**{n: None for n in _LAZY_BEFORE}, **eager, **{n: None for n in _LAZY_AFTER}}

    def _load(self, name: str) -> None:
        mount = self._loaders[name]
        sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
        mount(sub)
        built = typer.main.get_group(sub).commands
        for n, m in self._loaders.items():
            if m is mount and self._commands.get(n) is None and n in built:
                self._commands[n] = built[n]

    def __getitem__(self, name: str):
        if self._commands[name] is None:
            self._load(name)
        return self._commands[name]

    def __setitem__(self, name: str, cmd) -> None:
        self._commands[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._commands[name]

    def __contains__(self, name: object) -> bool:
        return name in self._commands

    def __iter__(self) -> Iterator[str]:
        return iter(self._commands)

    def __len__(self) -> int:
        return len(self._commands)


class _LazyGroup(PlainParams, TyperGroup):
    def __init__(self, *, commands=None, **kwargs):
        super().__init__(**kwargs)
        self.commands = _LazyCommands(dict(commands or {}))

    def list_commands(self, ctx) -> list[str]:
        return list(self.commands)


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, cls=_LazyGroup,
                  rich_markup_mode=None,  # plain help: rich cuts long flag names at 80 columns
                  help="Simulate batching policies for GPU inference serving on measured cost tables.")


@app.callback()
def _group() -> None:
    # Keeps ``app`` a group although ``run`` is its only eagerly registered command.
    pass


@app.command(cls=PlainCommand)
def run(
    trace: Annotated[Path, typer.Argument(help="Request trace: schedsim CSV/Parquet, Azure LLM 2023 CSV or Mooncake JSONL.")],
    policy: o.Policy = "dynamic",
    profile: Annotated[Optional[Path], typer.Option(help="Cost table CSV (default: the bundled H200 BERT-base profile).")] = None,
    max_batch_size: o.MaxBatchSize = None,
    preferred_batch_size: o.PreferredBatchSize = None,
    max_queue_delay_us: o.MaxQueueDelayUs = None,
    prefetch: o.Prefetch = None,
    priority_levels: o.PriorityLevels = None,
    default_priority_level: o.DefaultPriorityLevel = None,
    max_queue_size: o.MaxQueueSize = None,
    default_timeout_us: o.DefaultTimeoutUs = None,
    timeout_action: o.TimeoutAction = None,
    allow_timeout_override: o.AllowTimeoutOverride = None,
    preserve_ordering: o.PreserveOrdering = None,
    batch_size: o.BatchSize = None,
    max_wait_us: o.MaxWaitUs = None,
    param: o.Param = [],
    triton_config: o.TritonConfig = None,
    instances: o.Instances = None,
    replicas: Annotated[int, typer.Option(help="Replicas behind a router, each with its own policy and --instances instances.")] = 1,
    router: Annotated[str, typer.Option(help="With --replicas > 1: round-robin, least-outstanding, jsq, or module:Class / file.py:Class.")] = "round-robin",
    seed: Annotated[int, typer.Option(help="Seed for service-time draws.")] = 1,
    replications: Annotated[int, typer.Option(help="Runs with seeds seed, seed+1, ...; reports means and 95% CIs.")] = 1,
    band: Annotated[Optional[float], typer.Option(help="Prediction band level: the range one live run of this trace lands in this share of the time (default 0.9 up to 50,000 requests; 0: none).")] = None,
    band_replications: Annotated[Optional[int], typer.Option(help="Replications behind the band (default 19: an exact 90% band; 39 gives steadier edges).")] = None,
    band_arrivals: Annotated[str, typer.Option(help="Band: fixed (replay the trace's arrivals, as a live run does) or resample (also redraw its inter-arrival gaps).")] = "fixed",
    warmup_s: o.WarmupS = 0.0,
    rate_scale: o.RateScale = 1.0,
    spread: Annotated[str, typer.Option(help="Service-time spread: auto, empirical, fitted or none.")] = "auto",
    extrapolate: Annotated[bool, typer.Option(help="Allow batch sizes outside the profile's measured range.")] = False,
    dispatch_overhead_us: Annotated[Optional[float], typer.Option(help="One constant per-batch host overhead (default: the profile's measured value and, where it has one, its per-sample term).")] = None,
    wake_overhead_us: Annotated[Optional[float], typer.Option(help="One constant extra cost of a batch that wakes an idle serving loop (default: the profile's wake-up curve by idle time, else its constant, else 0).")] = None,
    power_cap: Annotated[bool, typer.Option(help="Follow the profile's power_cap: a power-capped GPU runs batches slower after a spell of heavy ones (--no-power-cap: every batch at the profile loop's clock).")] = True,
    contention_profile: Annotated[list[Path], typer.Option(help="Profile measured with K instances at once on one GPU (repeatable); prices batches that run alongside others (default: the profile sidecar's contention_profiles).")] = [],
    out: Annotated[Optional[Path], typer.Option(help="Write requests.csv, summary.json (and plots) here.")] = None,
    plot: Annotated[bool, typer.Option(help="With --out: latency CDF, batch-size histogram, queue length PNGs.")] = False,
    overwrite: Annotated[bool, typer.Option(help="With --out: replace the run in a non-empty directory (its earlier files are removed first).")] = False,
    out_format: Annotated[str, typer.Option("--format", help="With --out: the per-request table as csv (requests.csv) or parquet (requests.parquet).")] = "csv",
    slo: o.Slo = [],
    slo_p99_ms: o.SloP99Ms = None,
    quiet: o.Quiet = False,
    json_output: o.JsonOutput = False,
    model_spec: o.ModelSpec = None,
    num_gpu_blocks: o.NumGpuBlocks = None,
    gpu_memory_gb: o.GpuMemoryGb = None,
    gpu_memory_utilization: o.GpuMemoryUtilization = None,
    block_size: o.BlockSize = None,
    max_num_seqs: o.MaxNumSeqs = None,
    max_num_batched_tokens: o.MaxNumBatchedTokens = None,
    enable_prefix_caching: o.EnablePrefixCaching = None,
    preemption_mode: o.PreemptionMode = None,
    swap_space_gb: o.SwapSpaceGb = None,
    watermark: o.Watermark = None,
    long_prefill_token_threshold: o.LongPrefillTokenThreshold = None,
    max_model_len: o.MaxModelLen = None,
    reservation: o.Reservation = None,
    vllm_compat: o.VllmCompat = None,
    scheduler_reserve_full_isl: o.SchedulerReserveFullIsl = None,
    async_scheduling: o.AsyncScheduling = None,
    scheduling_policy: o.SchedulingPolicy = None,
    enable_chunked_prefill: o.EnableChunkedPrefill = None,
    max_num_partial_prefills: o.MaxNumPartialPrefills = None,
    speculative_config: o.SpeculativeConfig = None,
    slo_ttft_ms: o.SloTtftMs = None,
    slo_tpot_ms: o.SloTpotMs = None,
    slo_e2e_ms: o.SloE2eMs = None,
):
    """Replay TRACE against a batching policy and report latency, throughput and batching.

    LLM policies (continuous, paged-kv, static on a trace with token columns) report
    TTFT, TPOT, ITL and end-to-end latency, token throughput and KV use instead.
    """
    # lazy: the simulator (numpy, pyarrow, the policies) costs 0.2-0.4 s that --help and the other commands skip
    from schedsim.run.runner import execute

    params = o.policy_params(
        max_batch_size=max_batch_size, preferred_batch_size=preferred_batch_size,
        max_queue_delay_us=max_queue_delay_us, prefetch=prefetch, priority_levels=priority_levels,
        default_priority_level=default_priority_level, max_queue_size=max_queue_size,
        default_timeout_us=default_timeout_us, timeout_action=timeout_action,
        allow_timeout_override=allow_timeout_override, preserve_ordering=preserve_ordering,
        batch_size=batch_size, max_wait_us=max_wait_us, param=param)
    spec = RunSpec(
        trace=trace, policy=policy, params=params,
        profile=profile, triton_config=triton_config, instances=instances, seed=seed,
        replications=replications, warmup_s=warmup_s, rate_scale=rate_scale, spread=spread,
        extrapolate=extrapolate, dispatch_overhead_us=dispatch_overhead_us,
        wake_overhead_us=wake_overhead_us, power_cap=power_cap, contention_profiles=tuple(contention_profile),
        out=out, plot=plot, overwrite=overwrite, out_format=out_format, replicas=replicas, router=router,
        band=band, band_replications=band_replications, band_arrivals=band_arrivals,
        slo=tuple(slo), slo_p99_ms=slo_p99_ms)
    llm = o.llm_options(locals())
    with o.Phases(not quiet) as phase:
        outcome = execute(spec, llm, phase)
    if json_output:
        o.print_json(outcome.summary)
        return
    # lazy: the summary tables are not needed with --json
    from schedsim.cli.summary import print_llm_summary, print_summary

    if "ttft_p50_ms" in outcome.summary:
        print_llm_summary(outcome)
    else:
        print_summary(outcome)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the Typer app with one-line errors and exit status 2 on bad input."""
    if argv is None and sys.argv[1:2] in (["run"], ["sweep"]):
        prepare_run_process()
    code = 1
    try:
        code = _main(argv)
        return code
    finally:
        from schedsim.run.outdir import settle_claimed_dirs

        settle_claimed_dirs(failed=code != 0)
        if argv is None:
            # Run as the program (the installed script passes no argv), the process exits
            # next: freezing every object spares the interpreter's final full collection
            # over all imported modules' objects (about 45 ms of a `schedsim run`).
            gc.freeze()


def prepare_run_process() -> None:
    """What ``schedsim run`` and ``schedsim sweep`` set for themselves when run as the program,
    before numpy and pyarrow load (each described below): freed memory kept for reuse, one
    OpenBLAS thread, pyarrow's buffers from malloc, numpy's arrays in ordinary pages. Values the
    user set are kept. A sweep's cells are runs one after another: 100 cells of 1,000,000
    requests took 5.57-5.75 s on one worker against 6.72-7.05 s with glibc's defaults, and two
    forked workers (which inherit the settings) gained more (benchmarks/README.md, bench_sweep)."""
    _reuse_freed_memory()
    _one_blas_thread()
    _arrow_from_malloc()
    _ordinary_pages()


def _one_blas_thread() -> None:
    """For ``schedsim run`` run as the program, before numpy loads: numpy's OpenBLAS starts a
    thread per core and their buffers at import, about 30 ms of CPU on 2 cores, for linear
    algebra that a run does not do. A value the user set is kept."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _ordinary_pages() -> None:
    """For ``schedsim run`` run as the program, before numpy loads: numpy's arrays in ordinary
    pages, not transparent huge pages (numpy advises them for arrays of 4 MB or more). A run
    writes each of its large columns once; a huge page is cleared 2 MB at a time when first
    touched, and what that costs here varied from run to run. A 2,000,000-request run, 10
    rounds in turn at load 0.9: system time 0.15-0.19 s against 0.12-0.77 s, CPU 0.97 s against
    1.15 s (medians), twice the page faults (each cheap). A value the user set is kept."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")


def _arrow_from_malloc() -> None:
    """For ``schedsim run`` run as the program, before pyarrow loads: pyarrow's default buffers
    come from malloc (the heap of :func:`_reuse_freed_memory`), not from its mimalloc pool, whose
    fresh memory no later array reuses. Reading a 2,000,000-row Parquet trace then takes about
    30 MB less peak memory and a third of the system time (0.13 s against 0.47 s, medians of 4
    in turn). The CSV reader asks for malloc's pool itself (schedsim.traces.io). A value the user
    set is kept."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def _reuse_freed_memory() -> None:
    """With glibc, for ``schedsim run`` run as the program: keep freed blocks of up to 256 MiB
    in the heap for reuse instead of handing each back to the kernel. A run allocates and frees
    columns of millions of rows one after another, and every fresh block costs a page fault per
    4 KiB page when first written: 0.03-0.07 s of system time in a 2,000,000-request run (3-9%
    of its CPU time), for about the same peak memory. Threads (pyarrow's CSV reader, the
    ``--out`` writer) allocate from that same heap, not from arenas of their own, so they too
    reuse what the run freed: about 4,000 fewer page faults in a 2,000,000-request run and 8,000
    fewer with ``--out``. The process exits soon after (long-running commands such as ``live``
    keep glibc's defaults)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return
    mallopt(-3, 256 << 20)  # M_MMAP_THRESHOLD: blocks below it come from the heap
    mallopt(-1, 1 << 30)    # M_TRIM_THRESHOLD: the heap's free top is kept up to 1 GiB
    mallopt(-8, 1)          # M_ARENA_MAX: one heap for every thread


def _main(argv: list[str] | None) -> int:
    try:
        rv = app(args=argv, standalone_mode=False)
    except InputError as exc:
        print(f"schedsim: error: {exc}", file=sys.stderr)
        return 2
    except typer.TyperException as exc:  # usage errors (exit 2) and other click errors
        message = " ".join(exc.format_message().split())
        print(f"schedsim: error: {message}", file=sys.stderr)
        return exc.exit_code
    except typer.Abort:
        print("schedsim: aborted", file=sys.stderr)
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    # Typer turns Ctrl-C into Exit(130) and, with standalone_mode=False, returns that code.
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
