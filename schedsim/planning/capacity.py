"""Capacity and headroom of one configuration: what a planner can act on.

An instance that batches is busy almost all the time at any load high enough to fill a
batch now and then, because batches grow with the queue: its busy time says nothing about
how much more load it takes. What does is the configuration's capacity:

- its **saturation rate**: the requests per second it serves when requests never stop
  coming. The simulator measures it on the run's own request mix, all queued at once, with
  the run's policy, instances and cost model, so preferred sizes, contention between
  instances and a power cap count as they do in the run. For the built-in policies it is
  ``instances * B / cost(B)`` with B the batch the policy forms from a long queue (the max
  batch size, the largest preferred size, the static batch size; 1 request for ``none``);
- with an SLO, the **highest rate that meets it**: the trace replayed faster or slower,
  searched by bisection between nothing and the saturation rate, with the SLO met and no
  overload (throughput at least 95% of the offered rate);

and from it the **headroom**, capacity over the offered rate (below 1: overloaded), and the
**work share**, offered rate over the saturation rate: the share of the GPU's batched
capacity the offered load uses.

For LLM policies the capacity is the output-token throughput the KV cache and the step
model allow: the run's requests all queued at once, measured over the steps formed while
requests were still waiting; divided by the mean output length it is a request rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from schedsim.core.metrics import OVERLOAD_SHORTFALL

BATCHES_PER_INSTANCE = 200
"""Full batches each instance runs in the saturation measurement: the last, partial batch
shifts the rate by well under 1%."""

MIN_REQUESTS, MAX_REQUESTS = 1_000, 200_000
"""Bounds on the requests queued for the saturation measurement."""

LLM_MIN_REQUESTS, LLM_MAX_REQUESTS = 200, 4_000
"""The same for LLM policies: enough to keep the running batch full for many steps."""

SEARCH_TOLERANCE = 0.01
"""The SLO search stops when the bracket is this narrow, relative to the rate."""


@dataclass(frozen=True)
class Capacity:
    """A configuration's capacity against the offered rate."""

    saturation_rps: float
    """Requests per second served with requests always waiting."""
    offered_rps: float
    """Requests per second the (measured part of the) trace offers."""
    slo_rps: float | None = None
    """The highest rate meeting the SLO, when one was given (0: not even the lowest tried)."""
    slo: tuple = ()
    """The SLO's terms as text."""
    mean_batch: float = math.nan
    """Mean batch (samples) in the saturation measurement."""
    tokens_per_s: float | None = None
    """LLM: output tokens per second at saturation."""

    @property
    def capacity_rps(self) -> float:
        """The SLO's rate when one was given, else the saturation rate."""
        return self.slo_rps if self.slo_rps is not None else self.saturation_rps

    @property
    def headroom(self) -> float:
        """Capacity over the offered rate: 2.0 takes twice the load; below 1 is overloaded."""
        return _ratio(self.capacity_rps, self.offered_rps)

    @property
    def work_share(self) -> float:
        """Offered rate over the saturation rate: the share of the batched capacity in use."""
        return _ratio(self.offered_rps, self.saturation_rps)

    def summary(self) -> dict:
        """summary.json's keys: ``capacity_rps``, ``headroom``, ``gpu_work_share`` and the details."""
        out = {"capacity_rps": self.capacity_rps, "headroom": self.headroom, "gpu_work_share": self.work_share,
               "capacity": {"saturation_rps": self.saturation_rps, "slo_rps": self.slo_rps,
                            "slo": list(self.slo), "saturation_mean_batch": self.mean_batch,
                            "basis": self.basis()}}
        if self.tokens_per_s is not None:
            out["capacity_output_tokens_per_s"] = self.tokens_per_s
        return out

    def basis(self) -> str:
        if self.slo_rps is not None:
            return (f"highest rate meeting {' and '.join(self.slo)} without overload "
                    f"(saturation {self.saturation_rps:,.1f} req/s)")
        if self.tokens_per_s is not None:
            return (f"saturation rate with requests always waiting ({self.tokens_per_s:,.0f} output tokens/s, "
                    f"{self.mean_batch:,.1f} requests running on average)")
        return f"saturation rate with requests always waiting (mean batch {self.mean_batch:,.1f} samples)"


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan


def burst(requests, count: int):
    """``count`` requests with the mix of ``requests`` (repeated if it has fewer), all
    arriving at time 0."""
    n = len(requests)
    idx = np.arange(count) % max(n, 1)

    def take(col):
        return np.ascontiguousarray(col[idx])

    return replace(requests, arrival_ns=np.zeros(count, np.int64), samples=take(requests.samples),
                   seq_len=take(requests.seq_len), priority=take(requests.priority),
                   timeout_ns=take(requests.timeout_ns), input_tokens=take(requests.input_tokens),
                   output_tokens=take(requests.output_tokens), hash_offsets=None, hash_ids=None)


def saturation(requests, policy, cost, simulate_fn, *, instances: int = 1, seed: int = 0) -> tuple[float, float]:
    """(requests per second, mean batch in samples) of ``policy`` on ``instances`` instances
    priced by ``cost`` with the mix of ``requests`` always waiting; ``simulate_fn`` is
    :func:`schedsim.core.simulate.simulate` (or a driver with its signature)."""
    if not len(requests):
        return math.nan, math.nan
    policy.reset(requests, instances)
    largest = policy.max_batch_samples() or 1
    mean_samples = float(requests.samples.mean()) or 1.0
    per_batch = max(1, math.ceil(largest / mean_samples))
    count = int(min(MAX_REQUESTS, max(MIN_REQUESTS, BATCHES_PER_INSTANCE * instances * per_batch)))
    result = simulate_fn(burst(requests, count), policy, cost, instances=instances, seed=seed)
    done = result.end_ns[result.end_ns >= 0]
    served = int(np.count_nonzero(result.batch_size > 0))
    if not served or not done.size or done.max() <= 0:
        return math.nan, math.nan
    return served / (int(done.max()) / 1e9), float(result.batch_samples.mean())


def llm_saturation(requests, policy, cost, simulate_fn, *, seed: int = 0) -> tuple[float, float, float]:
    """(output tokens per second, requests per second, mean running requests) of the LLM
    ``policy`` priced by ``cost`` (a step cost model) with the mix of ``requests`` always
    waiting, over the steps formed while some request still waited; ``simulate_fn`` is
    :func:`schedsim.core.llm_simulate.simulate_llm`."""
    n = len(requests)
    if not n:
        return math.nan, math.nan, math.nan
    max_seqs = int(getattr(policy, "max_num_seqs", 256) or 256)
    count = int(min(LLM_MAX_REQUESTS, max(LLM_MIN_REQUESTS, 4 * max_seqs)))
    result = simulate_fn(burst(requests, count), policy, cost, seed=seed)
    waiting = result.step_waiting > 0
    if not waiting.any():
        waiting = np.ones_like(result.step_waiting, dtype=bool)
    repeats = result.step_repeats[waiting].astype(np.float64)
    seconds = float((result.step_end_ns[waiting] - result.step_start_ns[waiting]).sum()) / 1e9
    if not seconds > 0:
        return math.nan, math.nan, math.nan
    decode = (result.step_tokens[waiting] - result.step_prefill_tokens[waiting]) * repeats
    # First tokens come out of prefill chunks: one per request that got its first token then.
    window_end = int(result.step_end_ns[waiting].max())
    first = np.count_nonzero((result.first_token_ns >= 0) & (result.first_token_ns <= window_end))
    tokens_per_s = (float(decode.sum()) + first) / seconds
    mean_out = float(requests.output_tokens.mean()) or 1.0
    running = float(np.average(result.step_seqs[waiting], weights=repeats))
    return tokens_per_s, tokens_per_s / mean_out, running


def llm_capacity(make_policy: Callable[[], object], requests, cost, offered_rps: float, *,
                 seed: int = 0) -> dict:
    """summary.json's capacity keys for an LLM run: ``make_policy()`` builds a fresh policy
    as the run's; ``cost`` is the run's step cost model."""
    from schedsim.core.llm_simulate import simulate_llm

    tokens, rate, running = llm_saturation(requests, make_policy(), cost, simulate_llm, seed=seed)
    return Capacity(rate, offered_rps, mean_batch=running, tokens_per_s=tokens).summary()


def highest_meeting(meets: Callable[[float], bool], hi: float, *, tolerance: float = SEARCH_TOLERANCE,
                    floor: float = 1e-4) -> float:
    """The largest x in (0, ``hi``] with ``meets(x)``, by bisection on a log scale, assuming
    that meeting at x means meeting at every lower x; 0.0 when not even ``hi * floor`` meets."""
    if meets(hi):
        return hi
    lo, lowest = hi, hi * floor
    while True:
        lo /= 4
        if lo < lowest:
            return 0.0
        if meets(lo):
            break
        hi = lo
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def keeps_up(summary: dict) -> bool:
    """Throughput at least :data:`OVERLOAD_SHORTFALL` of the offered rate."""
    offered, achieved = summary.get("offered_rps"), summary.get("throughput_rps")
    if offered is None or achieved is None or not (math.isfinite(offered) and math.isfinite(achieved)):
        return False
    return achieved >= OVERLOAD_SHORTFALL * offered


def gpu_busy_fraction(result, warmup_s: float = 0.0) -> float:
    """Share of the measured span (warm-up end to last completion) in which at least one
    instance ran a batch: the GPU's busy time, whatever the batches' sizes."""
    t0 = int(round(warmup_s * 1e9))
    start = np.clip(result.batch_start_ns, t0, None)
    end = np.clip(result.batch_end_ns, t0, None)
    if not end.size or end.max() <= t0:
        return math.nan
    t1 = int(end.max())
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    # Union of intervals: a new busy spell starts where a start passes every earlier end.
    reach = np.maximum.accumulate(end)
    new = np.ones(start.size, bool)
    new[1:] = start[1:] > reach[:-1]
    spell_start = start[new]
    spell_end = np.maximum.reduceat(end, np.flatnonzero(new))
    return float((spell_end - spell_start).sum() / (t1 - t0))


NEAR_CAPACITY_SHARE = 0.87
"""Above this share of the simulated saturation rate (headroom under 1.15) a run gets the
near-capacity warning. On real Triton servers (docs/validation/triton.md), cells offered
94-100% of the table's capacity ran either stably or saturated depending on the server, with
live means up to 3.9x apart; at 82%, on a machine whose servers matched its table, the
prediction was 5% off."""


def near_capacity_warning(summary: dict) -> str | None:
    """A warning when the offered rate is close to the saturation rate but not over it: there a
    few percent on the batch cost moves latency by tens of percent, so one server's figure is
    not another's. None when there is room (or when the run is overloaded: that warning says more)."""
    share = summary.get("gpu_work_share")
    saturation = (summary.get("capacity") or {}).get("saturation_rps")
    if not (isinstance(share, (int, float)) and math.isfinite(share)) or not NEAR_CAPACITY_SHARE < share <= 1:
        return None
    return (f"near capacity: the offered rate is {share:.0%} of this configuration's simulated saturation "
            f"({saturation:,.0f} req/s); a server a few percent slower than the table saturates here, and "
            "Triton servers on one machine have run up to 1.3x apart, so latency at this load is not one "
            "number: plan with more headroom, or read the band")

