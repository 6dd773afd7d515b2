"""``schedsim run`` for LLM policies: load the trace and step profile, simulate, summarise, write."""

from __future__ import annotations

import warnings
from pathlib import Path

from schedsim.core.llm_metrics import summarize_llm
from schedsim.core.llm_simulate import simulate_llm
from schedsim.core.metrics import combine_replications, offered_rate, overload_warning, overloaded
from schedsim.core.policy import Requests
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import load_step_profile
from schedsim.errors import InputError
from schedsim.live.llm_warmup import live_warm_tokens
from schedsim.registry import build_policy, load_policy_class
from schedsim.run.bands import (LLM_AUTO_MAX_REQUESTS, LLM_KEYS, compute_band, host_record_absent, host_sigma, plan_band,
                                 trace_duration_s)
from schedsim.run.llm_bands import NO_HOST_RECORD, StepSpread, llm_one, noisy
from schedsim.planning.capacity import llm_capacity
from schedsim.run.spec import LLMOptions, RunInputs, RunOutcome, effective_settings, policy_config, trace_notes
from schedsim.traces.io import scale_rate

LLM_POLICY_NAMES = ("continuous", "paged-kv", "llm-static")

DEFAULT_STEP_PROFILE = "llama-1b-bf16-h200-steps.csv"
"""The bundled decoder step profile (under profiles/), measured on an H200."""


def might_be_llm(policy: str, options: LLMOptions) -> bool:
    """Whether the trace must be looked at to tell an LLM run from a request-level one."""
    return policy in LLM_POLICY_NAMES or policy == "static" or ":" in policy or bool(options.given())


def is_llm_run(policy: str, trace) -> bool:
    """Whether ``--policy`` names an LLM policy (``static`` is one on a trace with token columns)."""
    if policy in LLM_POLICY_NAMES:
        return True
    if policy == "static":
        return bool(len(trace)) and bool((trace.output_tokens > 0).all())
    if ":" in policy:
        return bool(getattr(load_policy_class(policy), "llm", False))
    return False


def default_step_profile_path() -> Path:
    # Beside schedsim.cost.profile's default_profile_path(), without importing that module.
    return Path(__file__).resolve().parents[2] / "profiles" / DEFAULT_STEP_PROFILE


def execute_llm(spec, options: LLMOptions, trace):
    """Run an LLM policy as ``spec`` (a :class:`~schedsim.run.spec.RunSpec`) describes."""

    for flag, value in (("--slo-ttft-ms", options.slo_ttft_ms), ("--slo-tpot-ms", options.slo_tpot_ms),
                        ("--slo-e2e-ms", options.slo_e2e_ms)):
        if value is not None and not value > 0:
            raise InputError(f"{flag}: {value} is not valid; expected a number > 0")
    if spec.triton_config is not None:
        raise InputError(f"--triton-config: applies to --policy dynamic, not {spec.policy!r}")
    if spec.instances not in (None, 1):
        raise InputError("--instances: LLM policies model one engine; run replicas with schedsim plan/sweep")
    name = "llm-static" if spec.policy == "static" else spec.policy
    policy = build_policy(name, spec.params | options.params)
    if spec.rate_scale != 1.0:
        trace = scale_rate(trace, spec.rate_scale)
    requests = Requests.from_trace(trace)
    profile_path = spec.profile or default_step_profile_path()
    if not Path(profile_path).exists():
        raise InputError(f"{profile_path}: no such step profile; measure one with "
                         f"`schedsim profile llm` or pass --profile")
    profile = load_step_profile(profile_path)
    cost = StepCostModel.from_profile(profile)
    spec_note = cost.price_drafts(policy.speculative)   # speculative decoding's draft model
    budget = getattr(policy, "budget", None)
    if budget is not None:
        cost.bytes_per_block = budget.block_size * budget.spec.kv_bytes_per_token
        if cost.first_call_ns:   # what `schedsim live` runs before its clock starts pays no first call
            cost.warm_tokens = live_warm_tokens(requests, policy, profile.cuda_graph_batch_sizes)

    # Replication 0 is the point estimate, the model as fitted; later ones draw their steps
    # from the profile's measured spread, each from its own seed.
    spread = StepSpread.from_profile(profile)
    results, summaries = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(spec.replications):
            result = simulate_llm(requests, policy, noisy(cost, spread, spec.seed + i) if i else cost,
                                  seed=spec.seed + i, itl_from_ns=int(round(spec.warmup_s * 1e9)))
            results.append(result)
            summaries.append(summarize_llm(result, spec.warmup_s, slo_ttft_ms=options.slo_ttft_ms,
                                           slo_tpot_ms=options.slo_tpot_ms, slo_e2e_ms=options.slo_e2e_ms))
        band_plan, band_note = plan_band(spec.band, len(trace), spec.band_replications, spec.band_arrivals,
                                         auto_max=LLM_AUTO_MAX_REQUESTS)
        if band_plan is not None:
            summaries[0]["offered_rps"] = offered_rate(requests.arrival_ns[requests.arrival_ns >= int(round(spec.warmup_s * 1e9))])
            band = compute_band(band_plan, spec.seed, llm_one(spec, trace, requests, policy, cost, dict(
                slo_ttft_ms=options.slo_ttft_ms, slo_tpot_ms=options.slo_tpot_ms, slo_e2e_ms=options.slo_e2e_ms),
                spread), LLM_KEYS, sigma=host_sigma(profile.meta, trace_duration_s(trace), timeline=True),
                draws=spread.describe() if spread else None, point=summaries[0],
                level_sigma=spread.level_sigma if spread else 0.0,
                level_source=spread.level_source() if spread else None,
                absent=host_record_absent(profile.meta, NO_HOST_RECORD))
    notes = sorted({str(w.message) for w in caught}) + ([band_note] if band_note else [])
    notes += [spec_note] if spec_note else []
    for one in summaries:
        arrival_ns = requests.arrival_ns
        one["offered_rps"] = offered_rate(arrival_ns[arrival_ns >= int(round(spec.warmup_s * 1e9))])
    if len(summaries) == 1:
        summary = summaries[0]
    else:
        summary = combine_replications(summaries)
    if band_plan is not None:
        summary |= band
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the capacity burst's warnings repeat the run's
        summary |= llm_capacity(lambda: build_policy(name, spec.params | options.params), requests, cost,
                                summary.get("offered_rps", float("nan")), seed=spec.seed)
    grew = queue_growth(results[0], spec.warmup_s)
    if overloaded(summary) and grew is not None:
        notes.append(overload_warning(summary, grew))
    stats = {k: v for k, v in results[0].stats.items() if isinstance(v, (int, float, str, dict))}
    summary["config"] = policy_config(spec, RunInputs(trace, requests, policy, spec.params | options.params, 1)) | {
        "profile": str(profile_path), "seed": spec.seed, "replications": spec.replications,
        "slo_ttft_ms": options.slo_ttft_ms, "slo_tpot_ms": options.slo_tpot_ms,
        "slo_e2e_ms": options.slo_e2e_ms, "policy_stats": stats,
        "effective": effective_settings(policy) | {"instances": 1, "profile": Path(profile_path).name,
                                                   "device": profile.meta.get("device"),
                                                   "model": budget.spec.name if budget else None}}
    if notes:
        summary["warnings"] = notes
    if trace_notes(trace):
        summary["notes"] = trace_notes(trace)
    title = (f"{spec.policy} on {Path(spec.trace).name}: {len(trace):,} requests, "
             f"model {budget.spec.name if budget else '?'}, step profile {Path(profile_path).name}")
    outcome = RunOutcome(title, summary, results)
    if spec.out is not None:
        # lazy: imports pyarrow.csv; only a run that writes files needs it
        from schedsim.run.llm_report import write_llm_outputs

        outcome.written = write_llm_outputs(spec.out, results[0], trace.request_id, summary,
                                            spec.plot, spec.warmup_s)
    return outcome


def queue_growth(result, warmup_s: float) -> str | None:
    """How the wait for admission grew from the first fifth of the measured arrivals to the last
    (the warning's detail), or None when it did not grow.

    An LLM run's throughput counts until its last token, so long generations at the end of a
    trace put it below the offered rate on a server that kept up. Overload is a queue that
    grows through the trace: the last fifth waited more than twice as long as the first, and
    longer by more than 2% of the arrivals' span (a shortfall of 5% of the offered rate grows
    the wait by about 4% of the span)."""
    import numpy as np

    arrival = result.requests.arrival_ns
    keep = np.flatnonzero((arrival >= int(round(warmup_s * 1e9))) & (result.scheduled_ns >= 0))
    if keep.size < 10:
        return "" if keep.size < arrival.size else None
    fifth = keep.size // 5
    wait_ms = (result.scheduled_ns[keep] - arrival[keep]) / 1e6
    first, last = float(wait_ms[:fifth].mean()), float(wait_ms[-fifth:].mean())
    span_ms = (int(arrival[keep].max()) - int(arrival[keep].min())) / 1e6
    unscheduled = int(arrival.size - np.count_nonzero(result.scheduled_ns >= 0))
    if unscheduled == 0 and not (last > 2 * first and last - first > 0.02 * span_ms):
        return None
    return (f"; the queue grew through the trace (mean wait for admission {first:,.3g} ms in the first fifth of "
            f"requests, {last:,.3g} ms in the last)" + (f"; {unscheduled:,} never ran" if unscheduled else ""))

