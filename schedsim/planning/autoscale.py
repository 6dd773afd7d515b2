"""A simulated autoscaler: add a replica when utilisation stays high for a window, remove
one when it stays low.

:class:`UtilizationAutoscaler` is a pure decision object: every ``interval_s`` it is told
the utilisation of the routable replicas over the last interval and answers +1, -1 or 0.
:class:`~schedsim.planning.fleet.Scaling` is the fleet driver's side: it measures, applies the answer (a new
replica takes requests only after ``cold_start_s``; a removed one stops taking them and
is paid for until it has drained) and keeps the log and the bill.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from schedsim.core.metrics import measured_rows, summarize
from schedsim.core.results import COMPLETED
from schedsim.cost.model import CostModel
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.errors import InputError
from schedsim.planning.fleet import simulate_fleet
from schedsim.registry import build_policy, load_router
from schedsim.run.runner import contention_models, load_inputs


@dataclass
class UtilizationAutoscaler:
    """A utilisation rule: above ``up_threshold`` for ``window_s`` (">80% for 5 minutes") adds a
    replica; below ``down_threshold`` for as long removes one."""

    up_threshold: float = 0.8
    """Add a replica when every sample in the last ``window_s`` is above this."""
    down_threshold: float = 0.3
    """Remove one when every sample in the last ``window_s`` is below this."""
    window_s: float = 300.0
    """How long utilisation must stay past a threshold."""
    interval_s: float = 10.0
    """Time between utilisation samples."""
    cold_start_s: float = 60.0
    """From the decision to add a replica until it takes requests (paid for meanwhile)."""
    min_replicas: int = 1
    """Never fewer routable replicas."""
    max_replicas: int = 8
    """Never more replicas, starting ones included."""
    history: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        def need(ok, flag, value, valid):
            if not ok:
                raise InputError(f"{flag}: {value} is not valid; expected {valid}")

        need(0 < self.up_threshold <= 1, "--scale-up-above", self.up_threshold, "a fraction in (0, 1]")
        need(0 <= self.down_threshold < self.up_threshold, "--scale-down-below", self.down_threshold,
             "a fraction below --scale-up-above")
        need(self.interval_s > 0, "--interval-s", self.interval_s, "a number > 0")
        need(self.window_s >= self.interval_s, "--window-s", self.window_s, "a number >= --interval-s")
        need(self.cold_start_s >= 0, "--cold-start-s", self.cold_start_s, "a number >= 0")
        need(self.min_replicas >= 1, "--min-replicas", self.min_replicas, "an integer >= 1")
        need(self.max_replicas >= self.min_replicas, "--max-replicas", self.max_replicas,
             "an integer >= --min-replicas")

    @property
    def samples_per_window(self) -> int:
        return max(1, round(self.window_s / self.interval_s))

    def reset(self) -> None:
        self.history = []

    def decide(self, now_ns: int, utilization: float, active: int, starting: int) -> int:
        """+1 to add a replica, -1 to remove one, 0 to wait. A full window of samples, taken
        after any new replica is ready, is needed for every step, so one burst cannot
        trigger two."""
        if starting:  # judge the fleet only once the new replica takes its share
            self.history = []
            return 0
        self.history.append(utilization)
        recent = self.history[-self.samples_per_window:]
        if len(recent) < self.samples_per_window:
            return 0
        if min(recent) > self.up_threshold and active + starting < self.max_replicas:
            self.history = []
            return 1
        if max(recent) < self.down_threshold and active > self.min_replicas:
            self.history = []
            return -1
        return 0


def compare_with_fixed(base, autoscaler: UtilizationAutoscaler, router: str, initial: int,
                       fixed: int, slo_latency_ms: float) -> dict:
    """Run ``base`` (a RunSpec) on an autoscaled fleet and on ``fixed`` replicas; the figures
    of both: GPU-hours, latency, and SLO attainment (share of requests within the target)."""
    if not slo_latency_ms > 0:
        raise InputError(f"--slo-latency-ms: {slo_latency_ms} is not valid; expected a number > 0")
    if not autoscaler.min_replicas <= initial <= autoscaler.max_replicas:
        raise InputError(f"--initial-replicas: {initial} is not valid; expected between "
                         f"--min-replicas ({autoscaler.min_replicas}) and --max-replicas ({autoscaler.max_replicas})")
    if fixed < 1:
        raise InputError(f"--fixed-replicas: {fixed} is not valid; expected an integer >= 1")
    inputs = load_inputs(base)
    profile_path = base.profile or default_profile_path()
    cost = CostModel.from_profile(load_profile(profile_path), spread=base.spread, extrapolate=base.extrapolate)
    if inputs.instances > 1:
        contention = contention_models(base, profile_path, cost)
        if contention:
            cost.with_contention(contention)
    load_router(router)  # a bad name fails here, before any run

    def make_policy():
        return build_policy(base.policy, inputs.params)

    runs = {
        "autoscaled": simulate_fleet(inputs.requests, make_policy, cost, replicas=autoscaler.max_replicas,
                                     router=load_router(router), instances=inputs.instances, seed=base.seed,
                                     autoscaler=lambda: replace(autoscaler, history=[]),
                                     initial_replicas=initial),
        "fixed": simulate_fleet(inputs.requests, make_policy, cost, replicas=fixed,
                                router=load_router(router), instances=inputs.instances, seed=base.seed),
    }
    out = {}
    for name, fr in runs.items():
        res = fr.result
        s = summarize(res, base.warmup_s)
        keep = measured_rows(res, base.warmup_s)
        done = keep & (res.status == COMPLETED)
        latency_ms = (res.end_ns - res.requests.arrival_ns) / 1e6
        within = int((done & (latency_ms <= slo_latency_ms)).sum())
        active = [r for r in range(len(fr.replica_results)) if (fr.replica == r).any()]
        out[name] = {
            "replicas": fixed if name == "fixed" else f"{autoscaler.min_replicas}..{autoscaler.max_replicas}",
            "replicas_used": len(active),
            "gpu_hours": fr.gpu_ns / 3.6e12,
            "slo_attainment": within / max(int(keep.sum()), 1),
            **{k: s[k] for k in ("p50_ms", "p99_ms", "p999_ms", "throughput_rps", "completed", "rejected")},
            "passes": fr.passes,
        }
        if name == "autoscaled":
            out["scaling_log"] = [{"time_s": t / 1e9, "action": a, "replica": r, "active": k}
                                  for t, a, r, k in fr.scaling_log]
            out["_timeline"] = (res.requests.arrival_ns, fr.scaling_log, initial, latency_ms, done)
    out["slo_latency_ms"] = slo_latency_ms
    out["gpu_hours_saved"] = out["fixed"]["gpu_hours"] - out["autoscaled"]["gpu_hours"]
    return out
