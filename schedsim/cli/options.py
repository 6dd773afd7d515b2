"""Command-line options shared by ``schedsim run`` and ``schedsim live`` (``--cpu``: also ``profile``).

Typer needs every parameter written out in each command's signature; declaring each
policy flag once here keeps the two commands' names, help and parsing identical.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from schedsim.errors import InputError
from schedsim.run.spec import LLMOptions

Policy = Annotated[str, typer.Option(
    help="none, static, dynamic, or a user's policy as module:Class or path/file.py:Class")]
MaxBatchSize = Annotated[Optional[int], typer.Option(help="dynamic: most samples in one batch (default 64).")]
PreferredBatchSize = Annotated[Optional[str], typer.Option(
    "--preferred-batch-size", "--preferred-batch-sizes",
    help="dynamic: preferred sizes, e.g. 8,16,32 (default: the max batch size; Triton's preferred_batch_size).")]
MaxQueueDelayUs = Annotated[Optional[int], typer.Option(
    "--max-queue-delay-us", "--max-queue-delay-microseconds",
    help="dynamic: how long the oldest request may wait for a better batch (default 0). "
         "Triton's max_queue_delay_microseconds.")]
Prefetch = Annotated[Optional[bool], typer.Option("--prefetch/--no-prefetch", help=(
    "dynamic: form batches while instances are busy (Triton) or only when one is idle (default)."))]
PriorityLevels = Annotated[Optional[int], typer.Option(help="dynamic: priority levels (1 is served first).")]
DefaultPriorityLevel = Annotated[Optional[int], typer.Option(help="dynamic: level of requests with priority 0.")]
MaxQueueSize = Annotated[Optional[int], typer.Option(help="dynamic: per-level queue limit; a full queue rejects.")]
DefaultTimeoutUs = Annotated[Optional[int], typer.Option(
    "--default-timeout-us", "--default-timeout-microseconds",
    help="dynamic: queue timeout per request (Triton's default_timeout_microseconds).")]
TimeoutAction = Annotated[Optional[str], typer.Option(help="dynamic: REJECT or DELAY.")]
AllowTimeoutOverride = Annotated[Optional[bool], typer.Option(
    "--allow-timeout-override/--no-timeout-override",
    help="dynamic: a request's timeout_us replaces the default when shorter.")]
PreserveOrdering = Annotated[Optional[bool], typer.Option(
    "--preserve-ordering/--no-preserve-ordering", help="dynamic: responses leave in dispatch order.")]
BatchSize = Annotated[Optional[int], typer.Option(help="static: requests per batch (default 8).")]
MaxWaitUs = Annotated[Optional[int], typer.Option(
    help="static: send a partial batch once its oldest request waited this long.")]
Param = Annotated[list[str], typer.Option(
    help="Extra policy parameter key=value (repeatable), for users' policies.")]
TritonConfig = Annotated[Optional[Path], typer.Option(
    help="Take dynamic-batcher settings from a Triton config.pbtxt; flags override.")]
Instances = Annotated[Optional[int], typer.Option(help="Model instances serving in parallel (default 1).")]
WarmupS = Annotated[float, typer.Option(help="Leave out requests arriving before this time.")]
RateScale = Annotated[float, typer.Option(help="Replay the trace at this multiple of its rate.")]
Slo = Annotated[list[str], typer.Option(
    help="SLO on a summary metric, e.g. p99_ms<=5 (repeatable): the capacity reported is then the highest "
         "rate meeting it, found by replaying the trace faster and slower.")]
SloP99Ms = Annotated[Optional[float], typer.Option(help="Shorthand for --slo p99_ms<=X.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress display (shown only on a terminal, on stderr).")]
JsonOutput = Annotated[bool, typer.Option("--json", help="Print the summary as JSON instead of tables.")]
Cpu = Annotated[Optional[str], typer.Option(
    help="Pin the process before the engine starts: to a CPU number, or auto (the fastest by a "
         "short probe; a live run takes one per instance plus one for the load generator). "
         "Default: not pinned. Recorded as cpu_pinning in the machine metadata.")]


def int_list(text: str | None, flag: str) -> tuple[int, ...] | None:
    """``8,16,32`` (or ``8/16/32``) as a tuple; ``none`` or empty as ()."""
    if text is None:
        return None
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(v) for v in text.replace("/", ",").split(",") if v.strip())
    except ValueError:
        raise InputError(f"{flag}: {text!r} is not a comma-separated list of integers") from None


def key_values(pairs: list[str]) -> dict:
    """``--param key=value`` for users' policies; values parsed as int, float, bool or text."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--param: {pair!r} is not key=value")
        for convert in (int, float):
            try:
                out[key.strip()] = convert(value)
                break
            except ValueError:
                continue
        else:
            out[key.strip()] = {"true": True, "false": False}.get(value.lower(), value)
    return out


def policy_params(*, preferred_batch_size, param, **flags) -> dict:
    """The policy parameters the user gave (flags left unset are not passed on)."""
    given = dict(flags, preferred_batch_sizes=int_list(preferred_batch_size, "--preferred-batch-size"))
    return {k: v for k, v in given.items() if v is not None} | key_values(param)


def fmt_metric(summary: dict, key: str, digits: int = 3, unit: str = "") -> str:
    """A summary value for a table: thousands separators, and its 95% CI when replicated."""
    v = summary.get(key)
    if v is None:
        return "-"
    text = f"{v:,.{digits}f}{unit}" if isinstance(v, float) else f"{v:,}{unit}"
    ci = summary.get(f"{key}_ci")
    if ci:
        text += f"  [{ci[0]:,.{digits}f}, {ci[1]:,.{digits}f}]"
    return text


class Phases:
    """What a long run is doing, on stderr: a rich spinner with the phase and the time spent,
    only on a terminal and without ``--quiet``; nothing on a pipe (JSON and tables on stdout
    are never touched). Called with a phase's description; used as a context manager."""

    def __init__(self, enabled: bool = True):
        import sys

        self._progress = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=True)
            self._task = self._progress.add_task("starting", total=None)

    def __call__(self, description: str) -> None:
        if self._progress is not None:
            # Drawn now, not at the next tick: a phase shorter than the refresh period is still shown.
            self._progress.update(self._task, description=description, refresh=True)

    def __enter__(self) -> "Phases":
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()


def print_json(summary: dict) -> None:
    from schedsim.files import json_safe, sorted_keys   # lazy: it imports numpy, which --help does not need

    print(json.dumps(sorted_keys(json_safe(summary)), indent=2))


# --- LLM policies (continuous, paged-kv, static on token traces); vLLM's names -------------
ModelSpec = Annotated[Optional[str], typer.Option(
    help="LLM: model spec name (llama-1b default, llama-3-8b, ...) or a JSON / HF config.json file.")]
NumGpuBlocks = Annotated[Optional[int], typer.Option(
    "--num-gpu-blocks", "--num-gpu-blocks-override",
    help="LLM: KV blocks on the GPU (instead of --gpu-memory-gb; vLLM's --num-gpu-blocks-override).")]
GpuMemoryGb = Annotated[Optional[float], typer.Option(
    help="LLM: GPU memory to derive KV blocks from, as vLLM does (default 141, an H200).")]
GpuMemoryUtilization = Annotated[Optional[float], typer.Option(help="LLM: share of GPU memory vLLM may use (0.9).")]
BlockSize = Annotated[Optional[int], typer.Option(help="LLM: tokens per KV block (16).")]
MaxNumSeqs = Annotated[Optional[int], typer.Option(help="LLM: most requests running at once (256).")]
MaxNumBatchedTokens = Annotated[Optional[int], typer.Option(help="paged-kv: token budget per step (8192).")]
EnablePrefixCaching = Annotated[Optional[bool], typer.Option(
    "--enable-prefix-caching/--no-enable-prefix-caching", help="paged-kv: reuse cached full KV blocks of shared prefixes.")]
PreemptionMode = Annotated[Optional[str], typer.Option(help="paged-kv: recompute (vLLM v1) or swap (vLLM v0).")]
SwapSpaceGb = Annotated[Optional[float], typer.Option(
    "--swap-space-gb", "--swap-space", help="paged-kv swap: host swap space in GiB (4; vLLM's --swap-space).")]
Watermark = Annotated[Optional[float], typer.Option(
    help="paged-kv: share of GPU blocks admissions leave free (0.01 with swap, as vLLM v0; else 0).")]
LongPrefillTokenThreshold = Annotated[Optional[int], typer.Option(
    help="paged-kv: most prompt tokens one request computes per step (0 = no limit).")]
MaxModelLen = Annotated[Optional[int], typer.Option(help="LLM: longest prompt + output (default: the model spec's).")]
VllmCompat = Annotated[Optional[str], typer.Option(
    help="paged-kv: follow the scheduler of vLLM current (default), 0.10 or 0.8; the flags below override (docs/vllm.md).")]
SchedulerReserveFullIsl = Annotated[Optional[bool], typer.Option(
    "--scheduler-reserve-full-isl/--no-scheduler-reserve-full-isl",
    help="paged-kv: admit a request only when its whole prompt's KV blocks fit (current: on).")]
AsyncScheduling = Annotated[Optional[bool], typer.Option(
    "--async-scheduling/--no-async-scheduling",
    help="paged-kv: prepare the next step while one runs, hiding host time up to the GPU time (current: on).")]
SchedulingPolicy = Annotated[Optional[str], typer.Option(
    help="paged-kv: fcfs, or priority (the trace's priority column, lower first; victim the lowest).")]
EnableChunkedPrefill = Annotated[Optional[bool], typer.Option(
    "--enable-chunked-prefill/--no-enable-chunked-prefill",
    help="paged-kv: split prompts across steps (on), or run each whole or not at all.")]
MaxNumPartialPrefills = Annotated[Optional[int], typer.Option(
    help="paged-kv: most prompts partly prefilled in one step (default: no limit, as vLLM V1).")]
SpeculativeConfig = Annotated[Optional[str], typer.Option(
    help='paged-kv: speculative decoding as JSON, e.g. \'{"method": "eagle", "num_speculative_tokens": 3, '
         '"acceptance_rate": 0.7}\' (or "acceptance_profile": [...]; "draft_profile": a step profile).')]
Reservation = Annotated[Optional[str], typer.Option(
    help="continuous/static LLM: KV reserved per request: max, pow2 or oracle.")]
SloTtftMs = Annotated[Optional[float], typer.Option(help="LLM goodput: time-to-first-token SLO.")]
SloTpotMs = Annotated[Optional[float], typer.Option(help="LLM goodput: time-per-output-token SLO.")]
SloE2eMs = Annotated[Optional[float], typer.Option(help="LLM goodput: end-to-end latency SLO.")]


def llm_params(**flags) -> dict:
    """The LLM policy parameters the user gave (unset flags are not passed on)."""
    return {k: v for k, v in flags.items() if v is not None}


LLM_FLAGS = ("model_spec", "num_gpu_blocks", "gpu_memory_gb", "gpu_memory_utilization", "block_size",
             "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "preemption_mode",
             "swap_space_gb", "watermark", "long_prefill_token_threshold", "max_model_len", "reservation",
             "vllm_compat", "scheduler_reserve_full_isl", "async_scheduling", "scheduling_policy",
             "enable_chunked_prefill", "max_num_partial_prefills", "speculative_config")
"""The LLM policy flags ``run`` and ``live`` share (each command declares all of them)."""


def llm_options(values: dict):
    """The LLM-only flags of ``run`` and ``live`` as :class:`~schedsim.run.spec.LLMOptions`,
    from a command's arguments (its ``locals()``): :data:`LLM_FLAGS` and the SLOs."""
    return LLMOptions(slo_ttft_ms=values["slo_ttft_ms"], slo_tpot_ms=values["slo_tpot_ms"],
                      slo_e2e_ms=values["slo_e2e_ms"], params=llm_params(**{k: values[k] for k in LLM_FLAGS}))
