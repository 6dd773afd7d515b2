"""``schedsim live`` and ``schedsim validate``: the same policies against a real engine,
and predicted against measured.

The policy flags are those of ``schedsim run`` (declared again here, because Typer
needs each command's parameters spelled out; their meaning and parsing are shared:
``runner.load_inputs`` builds the policy and the trace for both commands).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from schedsim.cli import options as o
from schedsim.cli.summary import print_llm_summary, print_summary
from schedsim.errors import InputError
from schedsim.profiling.host import live_cpu_count, parse_cpu, pin_cpu

# The commands import their implementation (the drivers, the simulator, numpy, pyarrow)
# inside their bodies: --help imports this module to list them, and those imports cost
# about 0.5 s that listing the commands does not need.

BACKENDS = ("torch", "onnxruntime", "tensorrt")


@dataclass(frozen=True)
class LiveSpec:
    """Everything one ``schedsim live`` needs besides the policy and trace (``run``)."""

    run: object
    """A :class:`schedsim.run.runner.RunSpec`: trace, policy, params, instances, warm-up, out."""
    backend: str = "torch"
    """torch, onnxruntime or tensorrt."""
    model: str = "builtin:bert-base"
    """builtin:NAME or a model file."""
    device: str | None = None
    """cuda or cpu; None = cuda when available (torch), else cpu."""
    cuda_graphs: bool = True
    """torch on CUDA: replay one CUDA graph per shape."""
    precision: str | None = None
    """torch: fp16, bf16 or fp32; None = fp16 on CUDA, fp32 on the CPU."""
    seq_len: int = 128
    """seq_len of requests whose trace gives none."""
    threads: int = 1
    """onnxruntime: intra-op threads per instance."""
    time_limit_s: float | None = None
    """End the run this long after the trace start (partial)."""
    spin_us: float | None = None
    """Busy-wait before timed wake-ups; None = 150 on CUDA, 0 on the CPU."""
    wake_every_arrival: bool = False
    """Wake at every arrival whatever the policy's hints say."""
    seed: int = 0
    """Seed of the model weights and the input ids."""
    cpu: str | None = None
    """Pin the process to this CPU (a number or ``"auto"``) before the engine is built;
    None = not pinned (:func:`schedsim.profiling.host.pin_cpu`)."""


def _check_live(spec: LiveSpec) -> None:
    if spec.backend not in BACKENDS:
        raise InputError(f"--backend: {spec.backend!r} is not valid; expected {', '.join(BACKENDS)}")
    if spec.device not in (None, "cuda", "cpu"):
        raise InputError(f"--device: {spec.device!r} is not valid; expected cuda or cpu")
    if spec.run.out is None:
        raise InputError("--out: a live run needs an output directory")
    if spec.time_limit_s is not None and not spec.time_limit_s > 0:
        raise InputError(f"--time-limit-s: {spec.time_limit_s} is not valid; expected a number > 0")
    if spec.seq_len < 1:
        raise InputError(f"--seq-len: {spec.seq_len} is not valid; expected an integer >= 1")
    if spec.spin_us is not None and spec.spin_us < 0:
        raise InputError(f"--spin-us: {spec.spin_us} is not valid; expected a number >= 0")
    if spec.threads < 1:
        raise InputError(f"--threads: {spec.threads} is not valid; expected an integer >= 1")
    parse_cpu(spec.cpu)


def engine_factory(spec: LiveSpec, largest: int, max_seq: int, out_dir: Path):
    """(factory(i) -> context manager yielding an engine, info dict) for the spec's backend."""
    builtin = spec.model.startswith("builtin:")
    name = spec.model.partition(":")[2] if builtin else None
    if spec.backend == "tensorrt":
        if importlib.util.find_spec("tensorrt") is None:
            raise InputError("--backend tensorrt: TensorRT is not installed (pip install tensorrt); "
                             "use --backend torch or onnxruntime")
        raise InputError("--backend tensorrt: no TensorRT live runner in this schedsim yet; "
                         "use --backend torch or onnxruntime")
    if spec.backend == "onnxruntime":
        if importlib.util.find_spec("onnxruntime") is None:
            raise InputError("--backend onnxruntime: onnxruntime is not installed (pip install onnxruntime)")
        from schedsim.live.engines.ort_live import OrtRunner, build_encoder_onnx

        device = spec.device or "cpu"
        if builtin:
            path = build_encoder_onnx(name, out_dir / f"{name}.onnx", seed=spec.seed)
            vocab, max_pos = 30522, 512
        else:
            path, vocab, max_pos = Path(spec.model), None, None
            if not path.is_file():
                raise InputError(f"--model {spec.model}: no such file")
        info = {"backend": "onnxruntime", "model": spec.model, "model_file": str(path), "device": device,
                "threads": spec.threads, "backend_version": _version("onnxruntime")}
        return (lambda i: OrtRunner(path, intra_op_threads=spec.threads, device=device, vocab=vocab,
                                    max_seq_len=max_pos)), info
    # torch
    if not builtin:
        raise InputError(f"--model {spec.model}: --backend torch runs builtin models "
                         "(builtin:bert-base, builtin:bert-tiny); for an ONNX file use --backend onnxruntime")
    if importlib.util.find_spec("torch") is None:
        raise InputError("--backend torch: PyTorch is not installed (pip install torch)")
    import torch

    from schedsim.live.engines.torch_encoder import CONFIGS, TorchEncoderRunner, build_encoder

    if name not in CONFIGS:
        raise InputError(f"--model {spec.model}: unknown builtin model; expected "
                         + ", ".join(f"builtin:{n}" for n in CONFIGS))
    device = spec.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is reachable (torch.cuda.is_available() is False); "
                         "use --device cpu")
    precision = spec.precision or ("fp16" if device == "cuda" else "fp32")
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    if precision not in dtypes:
        raise InputError(f"--precision: {precision!r} is not valid; expected fp16, bf16 or fp32")
    if max_seq > CONFIGS[name].max_positions:
        raise InputError(f"--model {spec.model} takes seq_len up to {CONFIGS[name].max_positions}, "
                         f"but the trace has seq_len {max_seq}")
    model = build_encoder(name, device, dtypes[precision], seed=spec.seed)
    cuda_graphs = spec.cuda_graphs and device == "cuda"
    info = {"backend": "torch", "model": spec.model, "device": device, "precision": precision,
            "cuda_graphs": cuda_graphs, "backend_version": torch.__version__}
    return (lambda i: TorchEncoderRunner(model, max_batch=largest, max_seq_len=max_seq,
                                         cuda_graphs=cuda_graphs, record_gpu_time=device == "cuda")), info


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001
        return None


def execute_live(spec: LiveSpec):
    """Run ``schedsim live``: returns (title, summary, written paths)."""
    import numpy as np

    from schedsim.live.driver import run_live, write_live_outputs
    from schedsim.profiling.measure import gpu_state, machine_metadata
    from schedsim.core.metrics import summarize
    from schedsim.run.runner import load_inputs, policy_config

    _check_live(spec)
    inputs = load_inputs(spec.run)
    requests, policy = inputs.requests, inputs.policy
    policy.reset(requests, inputs.instances)
    largest = policy.max_batch_samples() or int(requests.samples.max() if len(requests) else 1)
    seq = np.where(requests.seq_len > 0, requests.seq_len, spec.seq_len)
    max_seq = int(seq.max()) if len(seq) else spec.seq_len
    # Before the engine (and torch's and CUDA's threads, which inherit the CPU set) exists.
    pinning = pin_cpu(spec.cpu, count=live_cpu_count(inputs.instances))
    out = Path(spec.run.out)
    out.mkdir(parents=True, exist_ok=True)
    factory, info = engine_factory(spec, int(largest), max_seq, out)
    # No busy-wait by default: a spinning Python thread holds the GIL the engine's worker
    # needs (measured on the H200: +10% engine time at 50% load; experiments/fidelity).
    spin = spec.spin_us if spec.spin_us is not None else 0.0
    gpu_before = gpu_state() if info["device"] == "cuda" else None
    result, extra = run_live(requests, policy, factory, instances=inputs.instances,
                             warmup_s=spec.run.warmup_s, time_limit_s=spec.time_limit_s,
                             default_seq_len=spec.seq_len, spin_us=spin,
                             wake_every_arrival=spec.wake_every_arrival, seed=spec.seed)
    info["machine"] = machine_metadata(gpu_before, probe_torch=spec.backend == "torch") | {"cpu_pinning": pinning}
    summary = summarize(result, spec.run.warmup_s)
    summary["config"] = policy_config(spec.run, inputs) | {
        "driver": "live", "backend": info["backend"], "model": spec.model, "device": info["device"],
        "seq_len": spec.seq_len, "seed": spec.seed, "spin_us": spin, "time_limit_s": spec.time_limit_s,
        "wake_every_arrival": spec.wake_every_arrival,
    } | {k: info[k] for k in ("precision", "cuda_graphs", "threads") if k in info}
    request_id = inputs.trace.request_id[:len(result.requests)]
    written = write_live_outputs(out, result, request_id, summary, extra, info, spec.run.plot,
                                 spec.run.warmup_s)
    title = (f"live {spec.run.policy} on {Path(spec.run.trace).name}: {len(result.requests):,} requests, "
             f"{inputs.instances} instance{'s' if inputs.instances > 1 else ''}, {info['backend']} "
             f"{spec.model} on {info['device']}" + (f" (PARTIAL: {extra['partial_reason']})"
                                                     if extra["partial"] else ""))
    return title, summary, written


def register(app) -> None:
    """Add the live and validate commands to the top-level app."""
    app.command()(live)
    app.command()(validate)


def live(
    trace: Annotated[Path, typer.Argument(help="Request trace (as for schedsim run).")],
    policy: o.Policy = "dynamic",
    backend: Annotated[str, typer.Option(help="Engine: torch, onnxruntime or tensorrt; torch-llm for LLM policies; triton: a real Triton server (--policy none or dynamic).")] = "torch",
    model: Annotated[Optional[str], typer.Option(help="builtin:bert-base, builtin:bert-tiny, or MODEL.onnx (onnxruntime); torch-llm: builtin:llama-1b (default) or builtin:llama-tiny. Default: builtin:bert-base (torch-llm: builtin:llama-1b).")] = None,
    device: Annotated[Optional[str], typer.Option(help="cuda or cpu (default: cuda when available for torch, else cpu).")] = None,
    cuda_graphs: Annotated[bool, typer.Option("--cuda-graphs/--no-cuda-graphs", help="torch on CUDA: one CUDA graph per batch shape.")] = True,
    precision: Annotated[Optional[str], typer.Option(help="torch: fp16, bf16 or fp32 (default fp16 on CUDA, fp32 on CPU; torch-llm: bf16 on CUDA).")] = None,
    seq_len: Annotated[int, typer.Option(help="seq_len of requests the trace gives none.")] = 128,
    threads: Annotated[int, typer.Option(help="onnxruntime: intra-op threads per instance; torch-llm on the CPU: torch threads.")] = 1,
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
    warmup_s: o.WarmupS = 0.0,
    rate_scale: o.RateScale = 1.0,
    time_limit_s: Annotated[Optional[float], typer.Option(help="Stop this long after the trace start; the outputs are marked partial.")] = None,
    spin_us: Annotated[Optional[float], typer.Option(help="Busy-wait this long before each timed wake-up (default 0: a spinning thread starves the engine worker of the GIL).")] = None,
    wake_every_arrival: Annotated[bool, typer.Option(help="Wake the dispatcher at every arrival, whatever the policy's hints say.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the model weights and input ids.")] = 0,
    cpu: o.Cpu = None,
    out: Annotated[Optional[Path], typer.Option(help="Write requests.csv, summary.json, batches.csv, live.json here (required).")] = None,
    plot: Annotated[bool, typer.Option(help="Also write the plots of schedsim run.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace the run in a non-empty --out directory (its earlier files are removed first).")] = False,
    json_output: o.JsonOutput = False,
    # --- LLM live backend (--backend torch-llm): the LLM flags of schedsim run ---
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
    # --- end of the LLM live flags ---
    triton_url: Annotated[Optional[str], typer.Option(help="--backend triton: drive the server already running at HOST:PORT (its HTTP endpoint) instead of starting one.")] = None,
    triton_model: Annotated[Optional[str], typer.Option(help="--backend triton: the model to drive on --triton-url.")] = None,
    triton_trace_rate: Annotated[Optional[int], typer.Option(help="--backend triton: also record Triton's per-request timestamps for one request in N (its trace API; off by default: it kills Triton 2.51 under load; server-side times come from its statistics and the builtin model's execution log).")] = None,
    client_processes: Annotated[int, typer.Option(help="--backend triton: client processes sending the trace (one asyncio loop each); raise it when the lateness grows.")] = 1,
):
    """Replay TRACE in real time against a real engine, driven by the same policy as schedsim run.

    --backend torch-llm runs an LLM policy (continuous, paged-kv, static on a token trace)
    on the paged-KV decoder (--model builtin:llama-1b or builtin:llama-tiny).
    """
    from schedsim.run.spec import RunOutcome, RunSpec

    params = o.policy_params(
        max_batch_size=max_batch_size, preferred_batch_size=preferred_batch_size,
        max_queue_delay_us=max_queue_delay_us, prefetch=prefetch, priority_levels=priority_levels,
        default_priority_level=default_priority_level, max_queue_size=max_queue_size,
        default_timeout_us=default_timeout_us, timeout_action=timeout_action,
        allow_timeout_override=allow_timeout_override, preserve_ordering=preserve_ordering,
        batch_size=batch_size, max_wait_us=max_wait_us, param=param)
    run = RunSpec(trace=trace, policy=policy, params=params, triton_config=triton_config, instances=instances, warmup_s=warmup_s,
                  rate_scale=rate_scale, out=out, plot=plot, overwrite=overwrite)
    if out is None:
        raise InputError("--out: a live run needs an output directory")
    # Every backend: checked before the directory is claimed and before any engine starts.
    for flag, value, least in (("--seed", seed, 0), ("--client-processes", client_processes, 1),
                               ("--threads", threads, 1), ("--seq-len", seq_len, 1)):
        if value < least:
            raise InputError(f"{flag}: {value} is not valid; expected an integer >= {least}")
    from schedsim.run.outdir import claim_run_dir

    claim_run_dir(out, overwrite)  # before any engine starts: the run owns its directory
    spec = LiveSpec(run=run, backend=backend, model=model, device=device, cuda_graphs=cuda_graphs,
                    precision=precision, seq_len=seq_len, threads=threads, time_limit_s=time_limit_s,
                    spin_us=spin_us, wake_every_arrival=wake_every_arrival, seed=seed, cpu=cpu)
    if backend == "triton":
        from schedsim.triton.live import TritonLiveSpec, execute_live_triton

        title, summary, written = execute_live_triton(TritonLiveSpec(
            run=run, model=model or "builtin:bert-tiny", device=device, precision=precision,
            cuda_graphs=cuda_graphs, seq_len=seq_len, seed=seed, threads=threads, time_limit_s=time_limit_s,
            url=triton_url, model_name=triton_model, trace_rate=triton_trace_rate, processes=client_processes))
        if json_output:
            o.print_json(summary)
        else:
            print_summary(RunOutcome(title, summary, [], written))
            print("client lateness (us, sent - scheduled): mean {mean:.1f}, p99 {p99:.1f}, max {max:.1f}"
                  .format(**summary["live"]["client_lateness_us"]) if summary["live"]["client_lateness_us"]["n"]
                  else "client lateness: nothing sent")
        return
    if triton_url or triton_model or triton_trace_rate is not None:
        raise InputError("--triton-url, --triton-model and --triton-trace-rate apply to --backend triton")
    # --- LLM live backend ---
    llm = o.llm_options(locals())
    if backend == "torch-llm":
        from schedsim.live.llm_run import LiveLLMSpec, execute_live_llm

        llm_spec = LiveLLMSpec(
            run=run, llm=llm,
            model=model or "builtin:llama-1b", device=device,
            cuda_graphs=cuda_graphs, precision=precision, time_limit_s=time_limit_s, spin_us=spin_us, seed=seed,
            threads=threads, cpu=cpu)
        title, summary, written = execute_live_llm(llm_spec)
        if json_output:
            o.print_json(summary)
        else:
            print_llm_summary(RunOutcome(title, summary, [], written))
            lv = summary["live"]
            if lv["engine_ms"].get("n"):
                print("engine per step (ms): mean {mean:.3f}, p99 {p99:.3f}; host outside the GPU per step "
                      "(ms): mean {0:.3f}".format(lv["step_host_ms"].get("mean", float("nan")), **lv["engine_ms"]))
        return
    if policy in ("continuous", "paged-kv", "llm-static"):
        raise InputError(f"--policy {policy}: an LLM policy runs on --backend torch-llm, not {backend}")
    if llm.given():
        raise InputError(f"{llm.given()[0]}: LLM flags apply to --backend torch-llm, not --backend {backend}")
    # --- end of the LLM live backend ---
    if model is None:
        from dataclasses import replace

        spec = replace(spec, model="builtin:bert-base")
    title, summary, written = execute_live(spec)
    if json_output:
        o.print_json(summary)
    else:
        print_summary(RunOutcome(title, summary, [], written))
        lv = summary["live"]
        print("issue lateness (us): mean {mean:.1f}, p99 {p99:.1f}, max {max:.1f}".format(**lv["issue_lateness_us"])
              if lv["issue_lateness_us"].get("n") else "issue lateness: no timed wake-up for an arrival")
        if lv["dispatch_us"].get("n"):
            print("dispatch overhead (us, decision to engine call): mean {mean:.1f}, p99 {p99:.1f}"
                  .format(**lv["dispatch_us"]))


def validate(
    sim: Annotated[Path, typer.Option(help="Output directory of schedsim run (the prediction).")],
    live_dir: Annotated[list[Path], typer.Option("--live", help="Output directory of schedsim live (the measurement); give it again for more runs of the same trace: the median of the runs is then the measurement.")],
    out: Annotated[Optional[Path], typer.Option(help="Write validation.json (and the plot) here instead of the live directory.")] = None,
    plot: Annotated[bool, typer.Option(help="Write latency_cdf_validation.png: predicted and measured CDFs overlaid.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print validation.json instead of a table.")] = False,
):
    """Put predicted (SIM) and measured (LIVE) latency, throughput and batch size side by side."""
    from schedsim.live.validate import print_validation, validate_dirs

    report = validate_dirs(sim, live_dir, out=out, plot=plot)
    if json_output:
        o.print_json(report)
    else:
        print_validation(report)
