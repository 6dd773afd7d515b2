"""``schedsim run`` as a function: load inputs, check them, simulate, summarise, write."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from schedsim.errors import InputError


@dataclass(frozen=True)
class RunSpec:
    """Everything one ``schedsim run`` needs."""

    trace: Path
    """Request trace file."""
    policy: str = "dynamic"
    """Built-in policy name, module:Class or file.py:Class."""
    params: dict = field(default_factory=dict)
    """Policy parameters given explicitly (override the Triton config)."""
    profile: Path | None = None
    """Cost table CSV; None = the bundled default."""
    triton_config: Path | None = None
    """Triton config.pbtxt to take dynamic-batcher settings from."""
    instances: int | None = None
    """Model instances; None = from the Triton config, else 1."""
    seed: int = 1
    """Seed of the first replication."""
    replications: int = 1
    """Independent runs with consecutive seeds."""
    warmup_s: float = 0.0
    """Requests arriving earlier are left out of every metric."""
    rate_scale: float = 1.0
    """Replay at this multiple of the trace's rate."""
    spread: str = "auto"
    """Service-time spread: auto, empirical, fitted or none."""
    extrapolate: bool = False
    """Allow batch sizes outside the profile's range."""
    dispatch_overhead_us: float | None = None
    """Per-batch host overhead; None = the profile's measured value."""
    wake_overhead_us: float | None = None
    """Extra cost of a batch that wakes an idle serving loop; None = the profile's value (or 0)."""
    power_cap: bool = True
    """Follow the profile's ``power_cap`` (the GPU slows after heavy batches), when it has one."""
    contention_profiles: tuple = ()
    """Profiles measured with several instances at once on one GPU; () = the sidecar's list."""
    out: Path | None = None
    """Output directory."""
    plot: bool = False
    """Write PNG plots into ``out``."""
    replicas: int = 1
    """Replicas behind a router, each with its own policy and ``instances`` instances."""
    router: str = "round-robin"
    """With replicas > 1: round-robin, least-outstanding, jsq, or module:Class / file.py:Class."""


@dataclass
class RunOutcome:
    title: str
    summary: dict
    results: list
    written: list = field(default_factory=list)


def _check(spec: RunSpec) -> None:
    if spec.replications < 1:
        raise InputError(f"--replications: {spec.replications} is not valid; expected an integer >= 1")
    if spec.warmup_s < 0:
        raise InputError(f"--warmup-s: {spec.warmup_s} is not valid; expected a number >= 0")
    if not spec.rate_scale > 0:
        raise InputError(f"--rate-scale: {spec.rate_scale} is not valid; expected a number > 0")
    if spec.instances is not None and spec.instances < 1:
        raise InputError(f"--instances: {spec.instances} is not valid; expected an integer >= 1")
    if spec.spread not in ("auto", "empirical", "fitted", "none"):
        raise InputError(f"--spread: {spec.spread!r} is not valid; expected auto, empirical, fitted or none")
    if spec.dispatch_overhead_us is not None and spec.dispatch_overhead_us < 0:
        raise InputError(f"--dispatch-overhead-us: {spec.dispatch_overhead_us} is not valid; expected >= 0")
    if spec.wake_overhead_us is not None and spec.wake_overhead_us < 0:
        raise InputError(f"--wake-overhead-us: {spec.wake_overhead_us} is not valid; expected >= 0")
    if spec.replicas < 1:
        raise InputError(f"--replicas: {spec.replicas} is not valid; expected an integer >= 1")
    if spec.plot and spec.out is None:
        raise InputError("--plot: needs --out DIR to write the plots into")


def policy_params(spec: RunSpec) -> tuple[dict, int]:
    """Policy keyword arguments and instance count, Triton config first, flags on top."""
    params, instances = {}, spec.instances
    if spec.triton_config is not None:
        from schedsim.triton.config import load_triton_config, to_policy_kwargs

        if spec.policy != "dynamic":
            raise InputError(f"--triton-config: applies to --policy dynamic, not {spec.policy!r}")
        cfg = load_triton_config(spec.triton_config)
        if cfg.max_batch_size == 0:
            raise InputError(f"{spec.triton_config}: max_batch_size: 0 means the model does not batch; "
                             "use --policy none")
        params = to_policy_kwargs(cfg)
        instances = instances or params.pop("instances")
        params.pop("instances", None)
    return params | spec.params, instances or 1


@dataclass
class RunInputs:
    """What ``schedsim run`` and ``schedsim live`` both build from a spec."""

    trace: object
    requests: object
    policy: object
    params: dict
    instances: int


def load_inputs(spec: RunSpec, trace=None) -> RunInputs:
    """Check the spec, build the policy, load (and rescale) the trace (unless given)."""
    from schedsim.registry import build_policy
    from schedsim.core.policy import Requests
    from schedsim.traces.io import load_trace, scale_rate

    _check(spec)
    params, instances = policy_params(spec)
    policy = build_policy(spec.policy, params)
    if trace is None:
        trace = load_trace(spec.trace)
    if spec.rate_scale != 1.0:
        trace = scale_rate(trace, spec.rate_scale)
    return RunInputs(trace, Requests.from_trace(trace), policy, params, instances)


def policy_config(spec: RunSpec, inputs: RunInputs) -> dict:
    """The summary's ``config`` keys that describe the run the same way for both drivers."""
    return {"trace": str(spec.trace), "policy": spec.policy, "params": _plain(inputs.params),
            "instances": inputs.instances, "warmup_s": spec.warmup_s, "rate_scale": spec.rate_scale}


def execute(spec: RunSpec, llm=None) -> RunOutcome:
    """Run ``spec``; ``llm`` (:class:`~schedsim.run.llm_runner.LLMOptions`) holds the LLM-only flags."""
    from schedsim.run.llm_runner import LLMOptions, execute_llm, is_llm_run, might_be_llm

    trace = None
    llm = llm or LLMOptions()
    if might_be_llm(spec.policy, llm):
        from schedsim.traces.io import load_trace

        _check(spec)
        trace = load_trace(spec.trace)
        if is_llm_run(spec.policy, trace):
            return execute_llm(spec, llm, trace)
        llm.reject_for_request_level(spec.policy)
    return _execute_request_level(spec, trace)


def _execute_request_level(spec: RunSpec, trace=None) -> RunOutcome:
    from schedsim.cost.model import CostModel
    from schedsim.core.metrics import combine_replications, summarize
    from schedsim.cost.profile import default_profile_path, load_profile
    from schedsim.core.simulate import pair_grid_model, simulate

    inputs = load_inputs(spec, trace)
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

    results, summaries = [], []
    for i in range(spec.replications):
        if spec.replicas > 1:
            from schedsim.planning.fleet import simulate_spec_fleet

            result = simulate_spec_fleet(spec, inputs, cost, seed=spec.seed + i)
        else:
            result = simulate(requests, policy, cost, instances=instances, seed=spec.seed + i)
        results.append(result)
        summaries.append(summarize(result, spec.warmup_s))
    summary = summaries[0] if len(summaries) == 1 else (
        combine_replications(summaries) | {"batch_size_histogram": summaries[0]["batch_size_histogram"],
                                           "utilization": summaries[0]["utilization"]})
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
    }
    if spec.replicas > 1:
        summary["config"] |= {"replicas": spec.replicas, "router": spec.router}
    title = (f"{spec.policy} on {Path(spec.trace).name}: {len(trace):,} requests, "
             f"{instances} instance{'s' if instances > 1 else ''}"
             + (f" on each of {spec.replicas} replicas behind {spec.router}" if spec.replicas > 1 else "")
             + f", profile {Path(profile_path).name}")
    outcome = RunOutcome(title, summary, results)
    if spec.out is not None:
        from schedsim.run.report import write_outputs  # pyarrow.csv only when writing

        outcome.written = write_outputs(spec.out, results[0], trace.request_id, summary, spec.plot,
                                        spec.warmup_s)
    return outcome


def contention_models(spec: RunSpec, profile_path, cost) -> dict:
    """Cost models for batches that share the GPU with other instances' batches, keyed by how
    many run at once (each profile's sidecar ``instances``)."""
    from schedsim.cost.model import CostModel
    from schedsim.cost.profile import load_profile

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


def _plain(params: dict) -> dict:
    out = {}
    for key, value in params.items():
        if isinstance(value, dict):
            value = {str(k): getattr(v, "__dict__", v) for k, v in value.items()}
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out
