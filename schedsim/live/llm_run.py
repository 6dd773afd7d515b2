"""``schedsim live --backend torch-llm``: an LLM policy on the paged engine, in real time.

Builds the policy exactly as ``schedsim run`` does for LLM policies
(:func:`schedsim.run.llm_runner.execute_llm`: the same flags, the same KV budget), opens a
:class:`~schedsim.live.engines.llm_engine.PagedLLMEngine` whose pool holds the policy's blocks,
replays the trace with :func:`schedsim.live.llm_driver.run_live_llm`, and writes what ``schedsim
run`` writes for an LLM policy (requests.csv, steps.csv, summary.json, plots) plus
live_steps.csv (per-step engine timings) and live.json (timing summaries, machine, failures).
Under ``--speculative-config`` with a model method it opens the target's draft model
(:func:`~schedsim.live.engines.llm_engine.draft_engine`) beside it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedsim.core.llm_metrics import summarize_llm
from schedsim.core.policy import Requests
from schedsim.errors import InputError
from schedsim.files import write_json
from schedsim.live.llm_driver import run_live_llm, write_live_steps_csv
from schedsim.live.llm_warmup import engine_context
from schedsim.profiling.host import parse_cpu, pin_cpu
from schedsim.profiling.measure import gpu_state, machine_metadata
from schedsim.registry import build_policy
from schedsim.run.llm_report import write_llm_outputs
from schedsim.run.llm_runner import is_llm_run
from schedsim.run.spec import RunInputs, check_spec, effective_settings, policy_config
from schedsim.traces.io import load_trace, scale_rate

LLM_MODELS = ("llama-1b", "llama-tiny")
"""Builtin decoders of :mod:`schedsim.live.engines.decoder` the live LLM backend serves."""


@dataclass(frozen=True)
class LiveLLMSpec:
    """Everything one ``schedsim live --backend torch-llm`` needs."""

    run: object
    """A :class:`schedsim.run.runner.RunSpec`: trace, policy, params, warm-up, rate scale, out, plot."""
    llm: object
    """A :class:`schedsim.run.llm_runner.LLMOptions`: the LLM flags (model spec, blocks, SLOs ...)."""
    model: str = "builtin:llama-1b"
    """builtin:llama-1b or builtin:llama-tiny."""
    device: str | None = None
    """cuda or cpu; None = cuda when available."""
    cuda_graphs: bool = True
    """Replay decode-only steps as CUDA graphs (CUDA only)."""
    precision: str | None = None
    """bf16, fp16 or fp32; None = bf16 on CUDA (the bundled step profile's), fp32 on the CPU."""
    time_limit_s: float | None = None
    """End the run this long after the trace start (partial)."""
    spin_us: float | None = None
    """Busy-wait before an idle engine's wake-up; None = 50."""
    seed: int = 0
    """Seed of the model weights and the prompts."""
    threads: int = 1
    """On the CPU: torch's intra-op threads (more than the idle cores makes every step crawl)."""
    cpu: str | None = None
    """Pin the process to this CPU (a number or ``"auto"``) before torch starts; None = not
    pinned (:func:`schedsim.profiling.host.pin_cpu`). An eager step is launch-bound: host speed."""
    overlap: bool = False
    """Form and pack each step while the one before runs, as async scheduling does
    (:func:`~schedsim.live.llm_driver.run_live_llm`'s ``overlap``); False: one step after another."""


def _check_model_matches(policy, name: str, cfg, params: dict) -> None:
    """The policy's KV budget must describe the engine's model (or be given in blocks)."""
    spec = policy.budget.spec
    same = (spec.layers, spec.kv_heads, spec.head_dim) == (cfg.layers, cfg.kv_heads, cfg.head_dim)
    if name == "llama-tiny":
        if "num_gpu_blocks" not in params:
            raise InputError("--model builtin:llama-tiny: it has no model spec to derive KV blocks from; "
                             "give --num-gpu-blocks")
        return
    if not same:
        raise InputError(f"--model-spec {spec.name}: {spec.layers} layers, {spec.kv_heads} KV heads of "
                         f"{spec.head_dim} describe another model than --model builtin:{name} "
                         f"({cfg.layers}, {cfg.kv_heads}, {cfg.head_dim}); use --model-spec {name}")


def _check_fits(name: str, cfgs: list, num_blocks: int, block_size: int, dtype_bytes: int, device: str) -> None:
    """``cfgs``: the target's config, and the draft model's when speculative decoding runs one
    (a pool of its own, as many blocks)."""
    from schedsim.live.engines.decoder import parameter_count  # lazy: imports torch (seconds), after CPU pinning

    kv = sum(num_blocks * block_size * 2 * c.layers * c.kv_heads * c.head_dim * dtype_bytes for c in cfgs)
    need = kv + sum(parameter_count(c) for c in cfgs) * dtype_bytes
    if device == "cuda":
        import torch  # lazy: torch costs seconds of start-up, and must load after CPU pinning

        free = torch.cuda.mem_get_info()[0]
        where = "free GPU memory"
    else:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return
        where = "available host memory"
    if need > 0.95 * free:
        raise InputError(f"--model builtin:{name}: {num_blocks:,} KV blocks of {block_size} tokens "
                         f"({kv / 2**30:.1f} GiB) plus weights need {need / 2**30:.1f} GiB, more than the "
                         f"{free / 2**30:.1f} GiB of {where}; lower --num-gpu-blocks or --gpu-memory-gb")


def execute_live_llm(spec: LiveLLMSpec):
    """Run ``schedsim live --backend torch-llm``: returns (title, summary, written paths)."""

    run, llm = spec.run, spec.llm
    check_spec(run)
    if spec.device not in (None, "cuda", "cpu"):
        raise InputError(f"--device: {spec.device!r} is not valid; expected cuda or cpu")
    if run.out is None:
        raise InputError("--out: a live run needs an output directory")
    if spec.time_limit_s is not None and not spec.time_limit_s > 0:
        raise InputError(f"--time-limit-s: {spec.time_limit_s} is not valid; expected a number > 0")
    if spec.spin_us is not None and spec.spin_us < 0:
        raise InputError(f"--spin-us: {spec.spin_us} is not valid; expected a number >= 0")
    if run.instances not in (None, 1):
        raise InputError("--instances: the LLM live backend runs one engine")
    if run.triton_config is not None:
        raise InputError(f"--triton-config: applies to --policy dynamic, not {run.policy!r}")
    parse_cpu(spec.cpu)
    for flag, value in (("--slo-ttft-ms", llm.slo_ttft_ms), ("--slo-tpot-ms", llm.slo_tpot_ms),
                        ("--slo-e2e-ms", llm.slo_e2e_ms)):
        if value is not None and not value > 0:
            raise InputError(f"{flag}: {value} is not valid; expected a number > 0")
    builtin = spec.model.startswith("builtin:")
    name = spec.model.partition(":")[2] if builtin else None
    if name not in LLM_MODELS:
        raise InputError(f"--model {spec.model}: --backend torch-llm serves "
                         + " or ".join(f"builtin:{m}" for m in LLM_MODELS))
    trace = load_trace(run.trace)
    if not is_llm_run(run.policy, trace):
        raise InputError(f"--backend torch-llm: needs an LLM policy (continuous, paged-kv, static) on a trace "
                         f"with input_tokens and output_tokens; got --policy {run.policy} on {Path(run.trace).name}")
    params = run.params | llm.params
    policy = build_policy("llm-static" if run.policy == "static" else run.policy, params)
    if getattr(policy, "budget", None) is None:
        raise InputError(f"--policy {run.policy}: the live LLM backend needs a policy with a KV budget "
                         "(continuous, paged-kv, static)")
    if run.rate_scale != 1.0:
        trace = scale_rate(trace, run.rate_scale)
    requests = Requests.from_trace(trace)
    if importlib.util.find_spec("torch") is None:
        raise InputError("--backend torch-llm: PyTorch is not installed (pip install torch)")
    # Before torch and CUDA start their threads, which inherit the CPU set.
    pinning = pin_cpu(spec.cpu)
    import torch  # lazy: torch costs seconds of start-up, and must load after CPU pinning

    from schedsim.live.engines.decoder import CONFIGS, DRAFT_MODELS  # lazy: imports torch (seconds), after CPU pinning
    from schedsim.live.engines.llm_engine import PagedLLMEngine, draft_engine  # lazy: imports torch, after CPU pinning
    from schedsim.live.speculative import MODEL_METHODS

    cfg = CONFIGS[name]
    drafting = policy.speculative is not None and policy.speculative.method in MODEL_METHODS
    _check_model_matches(policy, name, cfg, params)
    device = spec.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is reachable (torch.cuda.is_available() is False); "
                         "use --device cpu")
    if device == "cpu":
        if spec.threads < 1:
            raise InputError(f"--threads: {spec.threads} is not valid; expected an integer >= 1")
        torch.set_num_threads(spec.threads)
    precision = spec.precision or ("bf16" if device == "cuda" else "fp32")
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    if precision not in dtypes:
        raise InputError(f"--precision: {precision!r} is not valid; expected bf16, fp16 or fp32")
    budget = policy.budget
    _check_fits(name, [cfg] + ([CONFIGS[DRAFT_MODELS[name]]] if drafting else []), budget.num_blocks,
                budget.block_size, torch.finfo(dtypes[precision]).bits // 8, device)
    max_context = engine_context(requests, policy)
    out = Path(run.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)   # an old summary must not vouch for new files
    spin = 50.0 if spec.spin_us is None else spec.spin_us

    gpu_before = gpu_state() if device == "cuda" else None
    engine = PagedLLMEngine(name, budget.num_blocks, budget.block_size, device, dtypes[precision],
                            cuda_graphs=spec.cuda_graphs, seed=spec.seed, max_context=max_context)
    draft = draft_engine(engine) if drafting else None
    try:
        with engine, (draft if draft is not None else contextlib.nullcontext()):
            result, extra = run_live_llm(requests, policy, engine, time_limit_s=spec.time_limit_s,
                                         warmup_s=run.warmup_s, seed=spec.seed, spin_us=spin, draft=draft,
                                         overlap=spec.overlap)
            describe = engine.describe()
            if draft is not None:
                describe["draft"] = {"model": f"builtin:{draft.name}"} | draft.describe()
    except torch.OutOfMemoryError as exc:
        raise InputError(f"--model builtin:{name}: out of memory with {budget.num_blocks:,} KV blocks "
                         f"({' '.join(str(exc).split())[:160]}); lower --num-gpu-blocks or --gpu-memory-gb") from None
    info = {"backend": "torch-llm", "model": spec.model, "device": device, "precision": precision,
            "cuda_graphs": bool(describe.get("cuda_graphs")), "backend_version": torch.__version__,
            "engine": describe,
            "machine": machine_metadata(gpu_before, probe_torch=True) | {"cpu_pinning": pinning}}
    summary = summarize_llm(result, run.warmup_s, slo_ttft_ms=llm.slo_ttft_ms, slo_tpot_ms=llm.slo_tpot_ms,
                            slo_e2e_ms=llm.slo_e2e_ms)
    stats = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in result.stats.items()
             if isinstance(v, (int, float, str, dict, np.integer, np.floating))}
    summary["config"] = policy_config(run, RunInputs(trace, requests, policy, params, 1)) | {
        "driver": "live", "backend": "torch-llm", "model": spec.model, "device": device,
        "precision": precision, "cuda_graphs": info["cuda_graphs"], "seed": spec.seed, "spin_us": spin,
        "threads": spec.threads if device == "cpu" else None,
        "time_limit_s": spec.time_limit_s, "slo_ttft_ms": llm.slo_ttft_ms, "slo_tpot_ms": llm.slo_tpot_ms,
        "slo_e2e_ms": llm.slo_e2e_ms, "overlap": spec.overlap,
        "draft_model": f"builtin:{draft.name}" if draft is not None else None, "policy_stats": stats,
        "effective": effective_settings(policy) | {"instances": 1, "overlap": spec.overlap}}
    if policy.async_scheduling and not spec.overlap:   # the policy's switch prices steps in the simulator
        summary["warnings"] = summary.get("warnings", []) + [
            "async scheduling: this engine prepares each step after the one before has run (no "
            "overlap); to predict it, run both schedsim live and schedsim run with --no-async-scheduling"]
    summary["partial"] = bool(extra["partial"])
    if extra["partial"]:
        summary["partial_reason"] = extra["partial_reason"]
    timing = {k: v for k, v in extra.items() if k not in ("steps", "tokens")}
    summary["live"] = {k: timing[k] for k in ("engine_gpu_ms", "engine_ms", "step_host_ms", "schedule_us",
                                              "delivery_delay_us", "swaps", "failed_steps", "engine_warmup_s",
                                              "warmup_eager_s", "padding_null_writes", "draft_ms", "draft_steps",
                                              "overlap_ms")}
    written = []
    path = out / "live_steps.csv"
    write_live_steps_csv(path, extra["steps"])
    written.append(path)
    path = out / "live.json"
    write_json(path, info | timing)
    written.append(path)
    request_id = trace.request_id[:len(result.requests)]
    written += write_llm_outputs(out, result, request_id, summary, run.plot, run.warmup_s)
    title = (f"live {run.policy} on {Path(run.trace).name}: {len(result.requests):,} requests, torch-llm "
             f"{spec.model} ({precision}) on {device}, {budget.num_blocks:,} KV blocks"
             + (f" (PARTIAL: {extra['partial_reason']})" if extra["partial"] else ""))
    return title, summary, written
