"""Prediction bands: the range one live run of a trace lands in, at a stated level.

A confidence interval of a mean says where the average over many runs is; a band says
where *one* run's figure lands. It is built by replaying the trace ``n`` more times with
independent draws of what a live run redraws, and taking order statistics of each figure
across the replications:

- service times: a fresh seed for every replication, so each batch draws its time from
  the profile's measured spread (its raw samples, or the table's fitted percentiles);
- for LLM policies, step times from the step profile's measured spread, split into
  per-step noise and a per-run level (:mod:`schedsim.run.llm_bands`);
- the host's speed, when the profile's sidecar carries a ``host_variation`` record
  (:mod:`schedsim.profiling.host_variation`). With the record's timeline, each
  replication replays a stretch of the measured speeds window by window (:class:`HostTimeline`:
  the trace is simulated on host time and read back on the wall clock), so a slow spell
  lasting seconds builds the queue it builds live, and a host slower than when the table
  was measured runs slower. Without a timeline (older records), each replication runs on
  the table times one log-normal factor, median 1, whose variance is the record's between-runs variance plus its
  within-run variance shrunk by how many windows the trace spans;
- arrivals, only when asked (``arrivals="resample"``): the trace's inter-arrival gaps
  drawn with replacement (a renewal bootstrap), the other columns kept row by row. A live
  replay of a trace file keeps its arrivals, so the default ("fixed") does not redraw them.

Each replication has the trace's own length, so the band is as wide as a run of that
length varies: a shorter trace gives a wider band (for a mean, about 1/sqrt(n)).

Edges: with ``n`` replications and level ``L``, the band is
``[X_(k), X_(n+1-k)]`` with ``k = (1 - L) / 2 * (n + 1)`` (Hyndman and Fan's type 6
quantile, ``numpy.quantile(method="weibull")``; interpolated when ``k`` is not whole).
For ``n`` independent draws and one more from the same distribution, the new one falls
below ``X_(k)`` with probability ``k / (n + 1)`` whatever the distribution, so the band
covers one new run with probability ``L`` exactly: 19 replications and their minimum and
maximum for 90%, 39 and their second smallest and second largest. Plain 5%/95% sample
quantiles of 20 replications would cover about 81%.

The point estimate (the run at ``--seed``) is not one of the replications and does not
change with the band: the band's draws come from their own stream, seeded by
``(seed, "band")``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from schedsim.errors import InputError

DEFAULT_LEVEL = 0.9
"""The band's level when ``--band`` is not given."""

AUTO_MAX_REQUESTS = 50_000
"""Without ``--band``, traces longer than this get no band (said in a note): the band
replays the trace 19 more times, about 5 s for 50,000 requests and minutes for 2M on one
core. ``--band LEVEL`` computes it at any length."""

LLM_AUTO_MAX_REQUESTS = 2_000
"""The same for LLM runs, whose replications each simulate every step: 2,000 requests of a
few hundred tokens took 0.4 s a replication on a loaded 2-core host, 8 s for the band."""

DEFAULT_REPLICATIONS = 19
"""Replications by default: the least that gives an exact 90% band (its minimum and
maximum). ``--band-replications 39`` gives steadier edges (second smallest and largest)."""

REQUEST_KEYS = ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms", "throughput_rps")
"""Request-level figures given a band."""

LLM_KEYS = tuple(f"{m}_{q}_ms" for m in ("ttft", "tpot", "e2e") for q in ("p50", "p90", "p99", "mean")) \
    + ("throughput_rps",)
"""LLM figures given a band."""

ARRIVALS = ("fixed", "resample")

_STREAM = 0x62616E64  # "band": the band's draws are their own stream, beside --seed's


@dataclass(frozen=True)
class BandPlan:
    """What a band will be computed with."""

    level: float
    """Share of live runs the band covers, in (0, 1)."""
    replications: int
    """Replays of the trace with independent draws."""
    arrivals: str = "fixed"
    """``fixed`` (replay the trace's arrivals) or ``resample`` (bootstrap its gaps)."""


def plan_band(level: float | None, n_requests: int, replications: int | None = None,
              arrivals: str = "fixed", auto_max: int = AUTO_MAX_REQUESTS) -> tuple[BandPlan | None, str | None]:
    """The band to compute for a run of ``n_requests`` and a note to print (or None).

    ``level``: None = default (:data:`DEFAULT_LEVEL`, up to ``auto_max`` requests:
    :data:`AUTO_MAX_REQUESTS`, or :data:`LLM_AUTO_MAX_REQUESTS` for LLM runs); 0 = no band; else the level. ``replications``: None = 39 up to
    :data:`DEFAULT_REPLICATIONS`, raised to the least that reaches ``level``."""
    if arrivals not in ARRIVALS:
        raise InputError(f"--band-arrivals: {arrivals!r} is not valid; expected fixed or resample")
    if level is not None and not (level == 0 or 0 < level < 1):
        raise InputError(f"--band: {level} is not valid; expected a level in (0, 1), such as 0.9, or 0 for none")
    if replications is not None and replications < 2:
        raise InputError(f"--band-replications: {replications} is not valid; expected an integer >= 2")
    if level == 0:
        return None, None
    if level is None and n_requests > auto_max:
        return None, (f"no prediction band: {n_requests:,} requests is more than {auto_max:,}, and "
                      "a band replays the trace 19 more times; --band 0.9 computes it")
    level = DEFAULT_LEVEL if level is None else float(level)
    least = least_replications(level)
    if replications is None:
        replications = max(least, DEFAULT_REPLICATIONS)
    elif replications < least:
        raise InputError(f"--band-replications: {replications} cannot give a {level:.0%} band; "
                         f"it needs at least {least} (the band's edges are order statistics)")
    return BandPlan(level, int(replications), arrivals), None


def least_replications(level: float) -> int:
    """Fewest replications whose smallest and largest make a band of ``level``: n + 1 >= 2 / (1 - level)."""
    return max(2, math.ceil(2.0 / (1.0 - level) - 1e-9) - 1)


def band_edges(values, level: float) -> tuple[float, float]:
    """``(lo, hi)``: the type-6 quantiles at (1 -/+ level) / 2 of ``values`` (NaN when any is NaN)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0 or not np.isfinite(v).all():
        return math.nan, math.nan
    a = (1.0 - level) / 2.0
    # Below the reach of type 6 (p < 1/(n+1)) numpy clamps to the extremes.
    lo, hi = np.quantile(v, [a, 1.0 - a], method="weibull")
    return float(lo), float(hi)


def host_sigma(meta: dict, duration_s: float, *, timeline: bool = False) -> float:
    """Log-standard deviation of one run's host-speed factor from a sidecar's ``host_variation``
    (0 when absent): between-runs variance plus within-run window variance times
    ``min(1, window_s / duration_s)``. With ``timeline`` and a record that has one
    (:class:`HostTimeline`), 0: the replications then replay the measured speeds, their
    level from round to round and their movement within a round, instead of one factor."""
    rec = meta.get("host_variation") if isinstance(meta, dict) else None
    if not isinstance(rec, dict):
        return 0.0
    if timeline and HostTimeline.from_meta(meta) is not None:
        return 0.0
    between = float(rec.get("between_runs_cv", 0.0) or 0.0)
    within = float(rec.get("within_run_cv", 0.0) or 0.0)
    window = float(rec.get("window_s", 0.0) or 0.0)
    share = 1.0 if duration_s <= 0 or window <= 0 else min(1.0, window / duration_s)
    var = math.log1p(between ** 2) + math.log1p(within ** 2) * share
    return math.sqrt(var) if var > 0 else 0.0


NO_HOST_RECORD = ("the host's speed between and within runs: the profile's sidecar has no host_variation record "
                  "(schedsim profile --host-variation-s S measures one), so live runs scatter wider than this band")
"""A request-level band's ``absent`` entry when the profile has no host record."""


def host_record_absent(meta: dict, entry: str = NO_HOST_RECORD) -> tuple[str, ...]:
    """``absent`` for :func:`compute_band`: ``entry`` when ``meta`` has no host record."""
    return () if isinstance(meta, dict) and isinstance(meta.get("host_variation"), dict) else (entry,)


_HOST_STREAM = 0x686F7374  # "host": a replication's host timeline, drawn from its seed


@dataclass(frozen=True)
class HostPath:
    """One replication's host speed through the run: how many times slower than its run's
    factor the host is in each window of ``window_s`` from ``start_ns``."""

    start_ns: int
    window_s: float
    slowdown: np.ndarray
    """One per window, in time order; beyond the last the host runs at the run's factor."""

    def _knots(self) -> tuple[np.ndarray, np.ndarray]:
        # Wall time t and host time tau (the time the table prices: a batch of table time x
        # takes x of tau), piecewise linear: tau advances by window_s / slowdown per window.
        w = self.window_s * 1e9
        t = self.start_ns + w * np.arange(self.slowdown.size + 1)
        tau = self.start_ns + np.concatenate([[0.0], np.cumsum(w / self.slowdown)])
        far = 1e18   # past the last window, one to one
        return np.concatenate([[-far], t, [t[-1] + far]]), np.concatenate([[-far], tau, [tau[-1] + far]])

    def to_host(self, wall_ns: np.ndarray) -> np.ndarray:
        """Wall times (ns, int) as host times."""
        t, tau = self._knots()
        return np.rint(np.interp(np.asarray(wall_ns, dtype=np.float64), t, tau)).astype(np.int64)

    def to_wall(self, host_ns: np.ndarray) -> np.ndarray:
        """Host times (ns, int) back as wall times; negative entries (not run) are kept."""
        t, tau = self._knots()
        x = np.asarray(host_ns)
        out = np.rint(np.interp(x.astype(np.float64), tau, t)).astype(np.int64)
        return np.where(x < 0, x, out)


class HostTimeline:
    """The host's measured speed, replayed in the band: a record's rounds, each a sequence
    of windows whose slowdown is the window's mean call time over the record's reference
    (``window_factors`` times ``round_factors``: for the profile's own record, the host
    as it was when the table was measured).

    A replication's path is a block bootstrap of the measured rounds: it starts at a random
    window of a random round and runs on through the rounds that followed it in the record
    (wrapping at the end), so the run's level, its slow spells, their length and their
    order are all as measured (windows drawn one by one would average a spell away over a
    long trace; one factor per run would miss the spell's queue). When the rounds are
    servers (``rounds_are: servers``, ``schedsim profile --backend triton
    --triton-host-servers``), a live run stays on its server: the path cycles through the
    drawn round's windows instead of running on into the next server's."""

    def __init__(self, window_s: float, rounds: list[np.ndarray], stay_in_round: bool = False):
        self.window_s = float(window_s)
        self.rounds = [r for r in rounds if r.size]
        self.windows = int(sum(r.size for r in self.rounds))
        self.stay_in_round = bool(stay_in_round)

    @classmethod
    def from_meta(cls, meta: dict) -> "HostTimeline | None":
        """The timeline of a sidecar's ``host_variation`` record; None without one."""
        rec = meta.get("host_variation") if isinstance(meta, dict) else None
        if not isinstance(rec, dict) or not rec.get("window_factors") or not rec.get("window_s"):
            return None
        rounds = [np.asarray(r, dtype=np.float64) for r in rec["window_factors"]]
        levels = rec.get("round_factors") or [1.0] * len(rounds)
        if len(levels) != len(rounds) or not all(isinstance(v, (int, float)) and v > 0 for v in levels):
            raise InputError("host_variation.round_factors: expected one positive number per round of window_factors")
        if not any(r.size for r in rounds) or not all(np.isfinite(r).all() and (r > 0).all() for r in rounds):
            raise InputError("host_variation.window_factors: expected lists of positive numbers, one per round")
        return cls(float(rec["window_s"]), [r * float(v) for r, v in zip(rounds, levels)],
                   stay_in_round=rec.get("rounds_are") == "servers")

    def draw(self, rng: np.random.Generator, start_ns: int, span_s: float) -> HostPath:
        """A path covering ``span_s`` seconds from ``start_ns`` (and as long again, for the queue to drain)."""
        need = max(1, math.ceil(2.0 * span_s / self.window_s) + 1)
        k = int(rng.integers(len(self.rounds)))
        first = self.rounds[k]
        parts = [first[int(rng.integers(first.size)):]]
        have = parts[0].size
        while have < need:
            k = k if self.stay_in_round else (k + 1) % len(self.rounds)
            parts.append(self.rounds[k])
            have += self.rounds[k].size
        return HostPath(int(start_ns), self.window_s, np.concatenate(parts)[:need])

    def describe(self) -> str:
        return (f"the host's measured speed ({self.window_s:g} s windows: runs of the {len(self.rounds)} measured "
                f"rounds from a random window, {self.windows} windows)")


def on_host_path(result, requests, path: HostPath):
    """``result``, simulated on ``path``'s host times, with its times back on the wall clock
    and ``requests`` (the wall-clock arrivals) as its requests."""
    return dataclasses.replace(result, requests=requests, start_ns=path.to_wall(result.start_ns),
                               end_ns=path.to_wall(result.end_ns), batch_start_ns=path.to_wall(result.batch_start_ns),
                               batch_end_ns=path.to_wall(result.batch_end_ns))


def scale_profile(profile, factor: float):
    """``profile`` with every latency (table columns, raw samples) and its dispatch overheads
    multiplied by ``factor``."""
    columns = {k: (np.asarray(v) * factor if k.startswith("latency_ms") else v) for k, v in profile.columns.items()}
    samples = None if profile.samples is None else {k: np.asarray(v) * factor for k, v in profile.samples.items()}
    meta = dict(profile.meta)
    for key in ("dispatch_overhead_us", "dispatch_overhead_us_per_sample"):
        if isinstance(meta.get(key), (int, float)):
            meta[key] = meta[key] * factor
    return dataclasses.replace(profile, columns=columns, samples=samples, meta=meta)


def scaled_cost(cost, factor: float, contention: dict | None = None):
    """A request-level :class:`~schedsim.cost.model.CostModel` like ``cost`` on a host
    ``factor`` times slower (its contention models too)."""
    from schedsim.cost.model import CostModel

    def rebuild(m, wake: bool):
        return CostModel.from_profile(
            scale_profile(m.profile, factor), spread=m.spread, extrapolate=m.extrapolate,
            dispatch_overhead_s=m.dispatch_overhead_s * factor, dispatch_per_sample_s=m.dispatch_per_sample_s * factor,
            max_seq_len=m.max_seq_len, power_cap=m.power_cap is not None,
            wake_overhead_s=(None if m.wake_curve is not None else m.wake_overhead_s * factor) if wake else 0.0)

    out = rebuild(cost, True)
    if contention:
        out.with_contention({k: rebuild(m, False) for k, m in contention.items()})
    return out


def resample_arrivals(trace, rng: np.random.Generator):
    """``trace`` with its inter-arrival gaps drawn with replacement (same first arrival, same length)."""
    t = np.asarray(trace.arrival_s, dtype=np.float64)
    if t.size < 2:
        return trace
    gaps = np.diff(t)
    new = t[0] + np.concatenate([[0.0], np.cumsum(rng.choice(gaps, size=gaps.size, replace=True))])
    return dataclasses.replace(trace, arrival_s=new)


def compute_band(plan: BandPlan, seed: int, one: Callable[[int, float, np.random.Generator | None], dict],
                 keys: tuple[str, ...], *, sigma: float = 0.0,
                 draws: str | None = "service-time draws (a fresh seed per replication)",
                 point: dict | None = None, level_sigma: float = 0.0, level_source: str | None = None,
                 absent: tuple[str, ...] = ()) -> dict:
    """Run ``plan.replications`` replications, ``one(seed, host_factor, arrivals_rng)`` each
    returning a summary (``draws`` says what a fresh seed redraws; None: nothing, and when
    nothing else is redrawn either the band is ``point``, the run at ``seed``, without
    replaying), and give ``{key}_lo`` / ``{key}_hi`` for every ``key`` of ``keys``
    the summaries have, plus a ``band`` record saying how it was made. ``one`` may declare
    ``sources``, a list of what else it redraws from its seed (the host's timeline).

    ``sigma`` (the host record's) and ``level_sigma`` (the profile's own per-run level,
    ``level_source`` saying where it comes from) are log-standard deviations of one factor
    per replication, combined in variance; ``absent`` names sources the band lacks."""
    rng = np.random.default_rng([seed, _STREAM])
    n = plan.replications
    seeds = rng.integers(0, 2**31 - 1, size=n)
    both = math.hypot(sigma, level_sigma) if level_sigma > 0 else sigma
    factors = np.exp(both * rng.standard_normal(n)) if both > 0 else np.ones(n)
    if not draws and both == 0 and plan.arrivals == "fixed":
        # Nothing is redrawn: every replication would repeat the run at --seed.
        summaries = [one(seed, 1.0, None)] if point is None else [point]
    else:
        summaries = []
        for i in range(n):
            arrivals_rng = np.random.default_rng([seed, _STREAM, i]) if plan.arrivals == "resample" else None
            summaries.append(one(int(seeds[i]), float(factors[i]), arrivals_rng))
    out: dict = {}
    for key in keys:
        if all(isinstance(s.get(key), (int, float)) for s in summaries):
            out[f"{key}_lo"], out[f"{key}_hi"] = band_edges([s[key] for s in summaries], plan.level)
    sources = [draws] if draws else []
    if sigma > 0:
        sources.append(f"host speed (profile's host_variation: log-sd {sigma:.4f} per run)")
    if level_sigma > 0:
        sources.append(level_source or f"per-run level (log-sd {level_sigma:.4f})")
    sources += list(getattr(one, "sources", ()))
    if plan.arrivals == "resample":
        sources.append("arrivals (the trace's gaps resampled with replacement)")
    if not sources:
        sources.append("nothing varies (no spread in the cost model, no host_variation record, arrivals "
                       "fixed): the band is the point estimate")
    out["band"] = {
        "level": plan.level, "replications": n, "arrivals": plan.arrivals, "host_sigma": sigma,
        "sources": sources,
        **({"level_sigma": level_sigma} if level_sigma > 0 else {}),
        **({"absent": list(absent)} if absent else {}),
        "method": (f"order statistics of {n} replications of the whole trace with independent draws "
                   f"(type-6 quantiles at {(1 - plan.level) / 2:g} and {1 - (1 - plan.level) / 2:g}): "
                   f"the range one live run of this trace lands in {plan.level:.0%} of the time"),
    }
    return out


_PRINTED = {  # (label, keys with their short names, unit, digits) per line of the printout
    "request": [("latency", (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"), ("p999_ms", "p99.9"),
                             ("mean_ms", "mean")), "ms", 3),
                ("throughput", (("throughput_rps", ""),), "req/s", 1)],
    "llm": [(name.upper(), tuple((f"{name}_{q}_ms", q) for q in ("p50", "p90", "p99", "mean")), "ms", 2)
            for name in ("ttft", "tpot", "e2e")],
}


def band_text(summary: dict) -> str | None:
    """The printout's band lines: what the band is, then each banded figure's range; None
    when the run has no band."""
    band = summary.get("band")
    if not isinstance(band, dict):
        return None
    kind = "llm" if "ttft_p50_ms_lo" in summary else "request"
    lines = [f"{band['level']:.0%} band, the range one live run of this trace lands in {band['level']:.0%} of the "
             f"time ({band['replications']} replications; {', '.join(band['sources'])}):"]
    for label, keys, unit, digits in _PRINTED[kind]:
        parts = [f"{short + ' ' if short else ''}{summary[f'{k}_lo']:,.{digits}f}-{summary[f'{k}_hi']:,.{digits}f}"
                 for k, short in keys if f"{k}_lo" in summary]
        if parts:
            lines.append(f"  {label} {', '.join(parts)} {unit}")
    lines += [f"  not in the band: {what}" for what in band.get("absent", ())]
    return "\n".join(lines)


def request_level_one(spec, inputs, cost, contention: dict | None = None):
    """``one`` for :func:`compute_band` on a request-level run: simulate the (possibly
    resampled) trace on the (possibly host-scaled) cost model and summarise it."""
    from schedsim.core.metrics import summarize
    from schedsim.core.policy import Requests
    from schedsim.core.simulate import simulate
    from schedsim.planning.fleet import simulate_spec_fleet

    timeline = HostTimeline.from_meta(cost.profile.meta)

    def one(seed: int, factor: float, arrivals_rng) -> dict:
        run_inputs = inputs
        if arrivals_rng is not None:
            trace = resample_arrivals(inputs.trace, arrivals_rng)
            run_inputs = dataclasses.replace(inputs, trace=trace, requests=Requests.from_trace(trace))
        path = None
        if timeline is not None:
            # The run on the host's measured within-run movement: simulated on host time (the
            # arrivals moved onto it), then read back on the wall clock.
            wall = run_inputs.requests
            path = timeline.draw(np.random.default_rng([seed, _HOST_STREAM]), int(wall.arrival_ns[0]) if len(wall) else 0,
                                 trace_duration_s(run_inputs.trace))
            moved = dataclasses.replace(run_inputs.trace, arrival_s=path.to_host(wall.arrival_ns) / 1e9)
            run_inputs = dataclasses.replace(run_inputs, trace=moved, requests=Requests.from_trace(moved))
        c = cost if factor == 1.0 else scaled_cost(cost, factor, contention)
        if spec.replicas > 1:
            result = simulate_spec_fleet(spec, run_inputs, c, seed=seed)
        else:
            result = simulate(run_inputs.requests, run_inputs.policy, c, instances=run_inputs.instances, seed=seed)
        if path is not None:
            result = on_host_path(result, wall, path)
        return summarize(result, spec.warmup_s)

    one.sources = [timeline.describe()] if timeline is not None else []
    return one


def trace_duration_s(trace) -> float:
    """Span of the trace's arrivals in seconds (0 for fewer than two)."""
    t = trace.arrival_s
    return float(t[-1] - t[0]) if len(t) > 1 else 0.0


def scaled_step_cost(cost, factor: float):
    """An LLM :class:`~schedsim.cost.step_model.StepCostModel` like ``cost`` on a host ``factor``
    times slower: the fitted step coefficients, the serving loop's and step overheads and the
    first-call cost scaled (a least-squares fit of latencies times f is the fit times f)."""
    from schedsim.cost.step_model import StepCostModel

    out = StepCostModel(cost.profile, dataclasses.replace(cost.fit, coefficients=np.asarray(cost.fit.coefficients) * factor),
                        extrapolate_context=cost.extrapolate_context, bytes_per_block=cost.bytes_per_block,
                        swap_gb_per_s=cost.swap_gb_per_s,
                        loop_overhead_us=(cost.loop_ns[0] * factor / 1e3, cost.loop_ns[1] * factor / 1e3))
    out.overhead_ns = cost.overhead_ns * factor
    out.first_call_ns = cost.first_call_ns * factor
    out.warm_tokens = cost.warm_tokens
    # Speculative decoding: the drafts run on the same host, so their model slows by the same factor.
    out.draft = scaled_step_cost(cost.draft, factor) if cost.draft is not None else None
    out.draft_fraction = cost.draft_fraction
    return out
