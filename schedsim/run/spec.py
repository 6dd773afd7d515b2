"""What a run is: the spec of ``schedsim run`` (and ``live``), its LLM-only flags, what it
builds from them and what it returns. Shared by the request-level and LLM runners."""

from __future__ import annotations

import inspect
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
    overwrite: bool = False
    """Replace an earlier run's files in a non-empty ``out`` (refused otherwise)."""
    out_format: str = "csv"
    """How ``out`` holds the per-request table: csv (requests.csv) or parquet (requests.parquet)."""
    replicas: int = 1
    """Replicas behind a router, each with its own policy and ``instances`` instances."""
    router: str = "round-robin"
    """With replicas > 1: round-robin, least-outstanding, jsq, or module:Class / file.py:Class."""
    slo: tuple = ()
    """SLO terms on summary metrics (``p99_ms<=5``): the capacity is then the highest rate meeting them."""
    slo_p99_ms: float | None = None
    """Shorthand for the SLO term ``p99_ms<=X``."""
    band: float | None = None
    """Prediction band level; None = 0.9 up to 50,000 requests, 0 = none (:mod:`schedsim.run.bands`)."""
    band_replications: int | None = None
    """Replications behind the band; None = 19."""
    band_arrivals: str = "fixed"
    """``fixed`` (the trace's arrivals, as a live replay) or ``resample`` (bootstrap its gaps)."""


@dataclass(frozen=True)
class LLMOptions:
    """The LLM-only flags of ``schedsim run``."""

    slo_ttft_ms: float | None = None
    """Goodput: a request meets the SLO only if its TTFT is at most this."""
    slo_tpot_ms: float | None = None
    """... and its TPOT at most this."""
    slo_e2e_ms: float | None = None
    """... and its end-to-end latency at most this."""
    params: dict = field(default_factory=dict)
    """LLM policy parameters given explicitly (model_spec, block_size, ...)."""

    def given(self) -> list[str]:
        """The LLM flags set, as the user typed them."""
        flags = [f"--{k.replace('_', '-')}" for k in self.params]
        flags += [f for f, v in (("--slo-ttft-ms", self.slo_ttft_ms), ("--slo-tpot-ms", self.slo_tpot_ms),
                                 ("--slo-e2e-ms", self.slo_e2e_ms)) if v is not None]
        return flags

    def reject_for_request_level(self, policy: str) -> None:
        if self.given():
            raise InputError(f"{self.given()[0]}: applies to LLM policies (continuous, paged-kv, static "
                             f"on a trace with input_tokens/output_tokens), not --policy {policy} "
                             f"on this trace")


@dataclass
class RunOutcome:
    """What a run returns: its title line, summary.json's content, the results and the files written."""

    title: str
    summary: dict
    results: list
    written: list = field(default_factory=list)


@dataclass
class RunInputs:
    """What ``schedsim run`` and ``schedsim live`` both build from a spec."""

    trace: object
    requests: object
    policy: object
    params: dict
    instances: int


def check_spec(spec: RunSpec) -> None:
    """InputError naming the flag when a value of ``spec`` is out of range."""
    if spec.seed < 0:
        raise InputError(f"--seed: {spec.seed} is not valid; expected an integer >= 0")
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
    if spec.out_format not in ("csv", "parquet"):
        raise InputError(f"--format: {spec.out_format!r} is not valid; expected csv or parquet")


def policy_config(spec: RunSpec, inputs: RunInputs) -> dict:
    """The summary's ``config`` keys that describe the run the same way for both drivers."""
    config = {"trace": str(spec.trace), "policy": spec.policy, "params": _plain(inputs.params),
              "instances": inputs.instances, "warmup_s": spec.warmup_s, "rate_scale": spec.rate_scale}
    offset = getattr(inputs.trace, "meta", {}).get("arrival_offset_s")
    if offset is not None:
        config["arrival_offset_s"] = offset
    return config


def trace_notes(trace) -> list[str]:
    """What the run did to the trace's times that its reader must know."""
    offset = trace.meta.get("arrival_offset_s")
    if offset is None:
        return []
    return [f"arrival times start at {offset:,.3f} s (clock time, such as Unix time); "
            "times are measured from the first arrival"]


def _plain(params: dict) -> dict:
    out = {}
    for key, value in params.items():
        if isinstance(value, dict):
            value = {str(k): getattr(v, "__dict__", v) for k, v in value.items()}
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


def effective_settings(policy) -> dict:
    """The settings ``policy`` runs with, defaults included: each constructor parameter the
    object keeps under its own name (or, for ``*_us``, as ``*_ns``)."""
    out = {"policy": getattr(policy, "name", type(policy).__name__)}
    for name in inspect.signature(type(policy)).parameters:
        if hasattr(policy, name):
            value = getattr(policy, name)
        elif name.endswith("_us") and hasattr(policy, name[:-3] + "_ns"):
            ns = getattr(policy, name[:-3] + "_ns")
            value = ns // 1000 if isinstance(ns, int) and ns % 1000 == 0 else ns / 1000
        else:
            continue
        if isinstance(value, tuple):
            value = list(value)
        if value is None or isinstance(value, (bool, int, float, str, list)):
            out[name] = value
    return out
