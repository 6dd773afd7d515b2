"""``schedsim run`` as a function: load inputs, check them, simulate, summarise, write."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from schedsim.core.metrics import combine_replications, overload, summarize
from schedsim.core.policy import Requests
from schedsim.core.simulate import pair_grid_model, simulate
from schedsim.cost.model import CostModel
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.errors import InputError
from schedsim.registry import build_policy
from schedsim.run.bands import (REQUEST_KEYS, compute_band, host_record_absent, host_sigma, plan_band,
                                 request_level_one, trace_duration_s)
from schedsim.core.results import PolicyError
from schedsim.run.guard import check_served, guard, unwrap
from schedsim.run.outdir import claim_run_dir
from schedsim.run.spec import (LLMOptions, RunInputs, RunOutcome, RunSpec, check_spec, effective_settings,
                                 policy_config, trace_notes)
from schedsim.traces.io import from_first_arrival, load_trace, scale_rate


def policy_params(spec: RunSpec) -> tuple[dict, int]:
    """Policy keyword arguments and instance count, Triton config first, flags on top."""
    params, instances = {}, spec.instances
    if spec.triton_config is not None:
        from schedsim.triton.config import load_triton_config, to_policy_kwargs  # lazy: only with --triton-config

        if spec.policy != "dynamic":
            raise InputError(f"--triton-config: applies to --policy dynamic, not {spec.policy!r}")
        cfg = load_triton_config(spec.triton_config)
        if cfg.max_batch_size == 0:
            raise InputError(f"{spec.triton_config}: max_batch_size: 0 means the model does not batch; "
                             "use --policy none")
        if not cfg.has_dynamic_batching:
            if spec.params:
                raise InputError(f"--{next(iter(spec.params)).replace('_', '-')}: {spec.triton_config} has no "
                                 "dynamic_batching block, so Triton does not batch requests together")
            return {}, instances or cfg.instances
        params = to_policy_kwargs(cfg)
        instances = instances or params.pop("instances")
        params.pop("instances", None)
    return params | spec.params, instances or 1


def prepare_trace(spec: RunSpec, trace=None):
    """The trace ``spec`` names (loaded unless given), measured from its first arrival when its
    times are clock times, after checking that ``--warmup-s`` leaves requests to measure."""
    if trace is None:
        trace = load_trace(spec.trace)
    if trace.meta.get("arrival_offset_s") is None:
        trace = from_first_arrival(trace)
    if spec.warmup_s > 0 and len(trace):
        last_s = float(trace.arrival_s[-1]) / spec.rate_scale
        if spec.warmup_s > last_s:
            raise InputError(f"--warmup-s: {spec.warmup_s:g} s leaves no request to measure; the trace's "
                             f"last arrival is at {last_s:.6g} s")
    return trace


def effective_policy(spec: RunSpec) -> str:
    """The policy ``spec`` runs: a Triton config without a ``dynamic_batching`` block is served
    by Triton's default scheduler, which runs each request as it comes (``none``)."""
    if spec.triton_config is not None and spec.policy == "dynamic":
        from schedsim.triton.config import load_triton_config  # lazy: only with --triton-config

        if not load_triton_config(spec.triton_config).has_dynamic_batching:
            return "none"
    return spec.policy


NO_DYNAMIC_BATCHING = ("{path} has no dynamic_batching block: Triton's default scheduler runs each "
                       "request as it comes, simulated as --policy none")


def load_inputs(spec: RunSpec, trace=None) -> RunInputs:
    """Check the spec, build the policy, load (and rescale) the trace (unless given)."""
    check_spec(spec)
    params, instances = policy_params(spec)
    # A user's policy runs guarded: a spinning or failing one ends the run with one line.
    policy = guard(build_policy(effective_policy(spec), params), spec.policy)
    trace = prepare_trace(spec, trace)
    if spec.rate_scale != 1.0:
        trace = scale_rate(trace, spec.rate_scale)
    return RunInputs(trace, Requests.from_trace(trace), policy, params, instances)


def execute(spec: RunSpec, llm=None, phase=None, trace=None) -> RunOutcome:
    """Run ``spec``; ``llm`` (:class:`~schedsim.run.spec.LLMOptions`) holds the LLM-only flags;
    ``phase(text)``, when given, is told what the run is doing (a progress display); ``trace``:
    ``spec.trace`` already loaded (a sweep's cells share it)."""
    llm = llm or LLMOptions()
    phase = phase or (lambda text: None)
    check_spec(spec)
    slo_terms(spec)
    if spec.out is not None:
        claim_run_dir(spec.out, spec.overwrite)  # before simulating: a bad --out fails now
    if _might_be_llm(spec.policy, llm):
        from schedsim.run.llm_runner import execute_llm, is_llm_run

        check_spec(spec)
        trace = prepare_trace(spec, trace)
        if is_llm_run(spec.policy, trace):
            if slo_terms(spec):
                raise InputError("--slo/--slo-p99-ms: the capacity under an SLO is for request-level runs; "
                                 "LLM runs take --slo-ttft-ms, --slo-tpot-ms and --slo-e2e-ms (goodput)")
            if spec.out_format != "csv":
                raise InputError(f"--format: {spec.out_format} is for request-level runs; LLM runs write CSV")
            phase(f"simulating {len(trace):,} requests (LLM), then its capacity")
            return execute_llm(spec, llm, trace)
        llm.reject_for_request_level(spec.policy)
    return _execute_request_level(spec, trace, phase)


def _might_be_llm(policy: str, llm: LLMOptions) -> bool:
    """llm_runner.might_be_llm, without importing the LLM runner (its simulator, step cost model
    and bands: about 25 ms of a small run's start-up) for the request-level-only policies."""
    if policy in ("dynamic", "none") and not llm.given():
        return False
    from schedsim.run.llm_runner import might_be_llm

    return might_be_llm(policy, llm)


def _simulate_fleet(spec: RunSpec, inputs: RunInputs, cost, seed: int):
    from schedsim.planning.fleet import simulate_spec_fleet  # lazy: only with --replicas

    return simulate_spec_fleet(spec, inputs, cost, seed=seed)


def _execute_request_level(spec: RunSpec, trace=None, phase=lambda text: None) -> RunOutcome:
    inputs = load_inputs(spec, trace)
    notes = trace_notes(inputs.trace)
    band_plan, band_note = plan_band(spec.band, len(inputs.trace), spec.band_replications, spec.band_arrivals)
    notes += [band_note] if band_note else []
    if effective_policy(spec) != spec.policy:
        notes.append(NO_DYNAMIC_BATCHING.format(path=spec.triton_config))
        spec = dataclasses.replace(spec, policy=effective_policy(spec))
    trace, requests, policy, instances = inputs.trace, inputs.requests, inputs.policy, inputs.instances
    profile_path = spec.profile or default_profile_path()
    cost = CostModel.from_profile(
        load_profile(profile_path), spread=spec.spread, extrapolate=spec.extrapolate,
        dispatch_overhead_s=None if spec.dispatch_overhead_us is None else spec.dispatch_overhead_us / 1e6,
        wake_overhead_s=None if spec.wake_overhead_us is None else spec.wake_overhead_us / 1e6,
        power_cap=spec.power_cap)
    contention = contention_models(spec, profile_path, cost) if instances > 1 else {}
    if contention:
        cost.with_contention(contention)
    policy.reset(requests, instances)
    largest = policy.max_batch_samples()
    if largest is not None:
        # Only the extremes matter (0 = not given: fine only for a one-seq_len profile).
        seq = trace.seq_len
        seq_lens = (int(seq.min()), int(seq.max())) if len(seq) else ()
        cost.check_covers(int(largest), seq_lens, what=_size_flag(spec.policy))

    writing: list = []  # requests.csv's writer, begun as soon as the first result exists
    try:
        return _simulate_and_report(spec, inputs, cost, contention, profile_path, notes, band_plan, phase, writing)
    except BaseException:
        for writer in writing:
            writer.abandon()  # no requests.csv of a run that failed
        raise


def _simulate_and_report(spec: RunSpec, inputs: RunInputs, cost, contention: dict, profile_path, notes: list,
                         band_plan, phase, writing: list) -> RunOutcome:
    trace, requests, policy, instances = inputs.trace, inputs.requests, inputs.policy, inputs.instances
    results, summaries = [], []
    for i in range(spec.replications):
        phase(f"simulating {len(requests):,} requests"
              + (f", replication {i + 1} of {spec.replications}" if spec.replications > 1 else ""))
        try:
            if spec.replicas > 1:
                result = _simulate_fleet(spec, inputs, cost, seed=spec.seed + i)
            else:
                result = simulate(requests, policy, cost, instances=instances, seed=spec.seed + i)
        except PolicyError as exc:
            raise policy_input_error(exc, spec.policy, policy) from exc
        check_served(result, spec.policy)
        results.append(result)
        if spec.out is not None and not writing:
            from schedsim.run.report import RequestsWriter  # pyarrow.csv only when writing

            writing.append(RequestsWriter(spec.out, result, trace.request_id, spec.out_format))
        summaries.append(summarize(result, spec.warmup_s))
    summary = summaries[0] if len(summaries) == 1 else (
        combine_replications(summaries) | {"batch_size_histogram": summaries[0]["batch_size_histogram"],
                                           "utilization": summaries[0]["utilization"]})
    if band_plan is not None:
        phase("prediction band")
        summary |= compute_band(band_plan, spec.seed, request_level_one(spec, inputs, cost, contention), REQUEST_KEYS,
                                sigma=host_sigma(cost.profile.meta, trace_duration_s(trace), timeline=True),
                                absent=host_record_absent(cost.profile.meta))
    grid_model = pair_grid_model(cost) if instances > 1 else None
    summary["config"] = policy_config(spec, inputs) | {
        "profile": str(profile_path), "seed": spec.seed, "replications": spec.replications,
        "spread": cost.spread, "dispatch_overhead_us": cost.dispatch_overhead_s * 1e6,
        "dispatch_overhead_us_per_sample": cost.dispatch_per_sample_s * 1e6,
        # The wake-up in use: the profile's curve by idle time, or one constant.
        "wake_overhead_us": None if cost.wake_curve is not None else cost.wake_overhead_s * 1e6,
        "wake_curve": cost.wake_curve.describe() if cost.wake_curve is not None else None,
        "contention_profiles": {k: str(m.profile.path) for k, m in contention.items()},
        # Instances with a measured pair grid share the GPU by the batches' sizes.
        "pair_slowdown": str(grid_model.profile.path) if grid_model is not None else None,
        "power_cap": cost.power_cap.describe() if cost.power_cap is not None else None,
        "effective": effective_settings(unwrap(policy)) | {
            "instances": instances, "profile": Path(profile_path).name,
            "device": cost.profile.meta.get("device"), "model": cost.profile.meta.get("model")},
    }
    if spec.replicas > 1:
        summary["config"] |= {"replicas": spec.replicas, "router": spec.router}
    if notes:
        summary["notes"] = notes
    summary |= request_capacity(spec, inputs, cost, summary, results[0], phase)
    from schedsim.planning.capacity import near_capacity_warning  # loaded with request_capacity's

    warning = overload(summary, results[0], spec.warmup_s) or near_capacity_warning(summary)
    if warning:
        summary["warnings"] = [warning]
    title = (f"{spec.policy} on {Path(spec.trace).name}: {len(trace):,} requests, "
             f"{instances} instance{'s' if instances > 1 else ''}"
             + (f" on each of {spec.replicas} replicas behind {spec.router}" if spec.replicas > 1 else "")
             + f", profile {Path(profile_path).name}")
    outcome = RunOutcome(title, summary, results)
    if spec.out is not None:
        from schedsim.run.report import write_outputs

        outcome.written = write_outputs(spec.out, results[0], trace.request_id, summary, spec.plot,
                                        spec.warmup_s, spec.out_format, requests_writer=writing[0])
    return outcome


def request_capacity(spec: RunSpec, inputs: RunInputs, cost, summary: dict, result,
                     phase=lambda text: None) -> dict:
    """summary.json's capacity keys (schedsim.planning.capacity): the saturation rate of this
    configuration, with ``--slo`` the highest rate meeting it, the headroom to the offered
    rate, and the GPU's busy fraction."""
    from schedsim.planning.capacity import Capacity, gpu_busy_fraction, highest_meeting, keeps_up, saturation

    slo = slo_terms(spec)
    policy, instances = inputs.policy, inputs.instances

    def simulate_at(requests, seed):
        try:
            if spec.replicas > 1:
                return _simulate_fleet(spec, dataclasses.replace(inputs, requests=requests), cost, seed=seed)
            return simulate(requests, policy, cost, instances=instances, seed=seed)
        except PolicyError as exc:
            raise policy_input_error(exc, spec.policy, policy) from exc

    phase("capacity: saturation rate")
    rate, mean_batch = saturation(inputs.requests, policy, cost,
                                  lambda r, p, c, instances, seed: simulate_at(r, seed),
                                  instances=instances, seed=spec.seed)
    offered = summary.get("offered_rps", float("nan"))
    slo_rps = None
    if slo:
        from schedsim.planning.objective import check_keys, meets

        check_keys(summary, [c.key for c in slo], "--slo")

        def meets_at(multiple: float) -> bool:
            phase(f"capacity under {' and '.join(map(str, slo))}: trying {offered * multiple:,.0f} req/s")
            scaled = scale_rate(inputs.trace, multiple)
            one = summarize(simulate_at(Requests.from_trace(scaled), spec.seed), spec.warmup_s / multiple)
            return meets(one, slo) and keeps_up(one)

        if offered > 0 and rate > 0:
            slo_rps = offered * highest_meeting(meets_at, rate / offered)
        else:
            slo_rps = float("nan")
    capacity = Capacity(rate, offered, slo_rps, tuple(str(c) for c in slo), mean_batch)
    return capacity.summary() | {"gpu_busy_fraction": gpu_busy_fraction(result, spec.warmup_s)}


def slo_terms(spec: RunSpec) -> tuple:
    """``--slo`` and ``--slo-p99-ms`` as constraints (checked before any simulating)."""
    if not spec.slo and spec.slo_p99_ms is None:
        return ()
    from schedsim.planning.objective import parse_slo

    return parse_slo(list(spec.slo), spec.slo_p99_ms)


def policy_input_error(exc: PolicyError, label: str, policy) -> InputError:
    """A policy that broke the driver's contract, as one line naming the policy."""
    if isinstance(exc.__cause__, InputError) or str(exc).startswith("--policy"):
        return InputError(str(exc))
    text = str(exc).replace(type(policy).__name__, type(unwrap(policy)).__name__, 1)
    return InputError(f"--policy {label}: {text}")


def contention_models(spec: RunSpec, profile_path, cost) -> dict:
    """Cost models for batches that share the GPU with other instances' batches, keyed by how
    many run at once (each profile's sidecar ``instances``)."""
    base = Path(profile_path).parent
    paths = [Path(p) for p in spec.contention_profiles] or [
        base / p for p in cost.profile.meta.get("contention_profiles", [])]
    models = {}
    for path in paths:
        profile = load_profile(path)
        k = int(profile.meta.get("instances", 1) or 1)
        if k < 2:
            raise InputError(f"{path}: instances: {k}; a contention profile is measured with "
                             "several instances at once (schedsim profile --instances K)")
        # The wake-up overhead is the serving loop's, added once by the driver from the base model.
        models[k] = CostModel.from_profile(profile, spread=spec.spread, extrapolate=spec.extrapolate,
                                           wake_overhead_s=0.0)
    return models


def _size_flag(policy: str) -> str:
    return {"static": "--batch-size", "none": "the trace's batch column"}.get(policy, "--max-batch-size")
