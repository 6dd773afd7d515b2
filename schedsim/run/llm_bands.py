"""What an LLM band redraws: step times from the step profile's measured spread, the
profile's per-run level, and the host's speed from its ``host_variation`` record.

The step cost model prices a step at its fitted mean. A live engine's steps scatter
around it, and a live run as a whole sits at a level of its own. The step profile
measures both, and this module splits them (docs/validation/bands.md, "The LLM band"):

- **Per-run level** (:attr:`StepSpread.level_sigma`): what moves every composition
  together between sampling rounds. The profiler visits every composition once per round,
  in a fresh random order, and its sidecar's ``drift`` record gives, per composition, the
  median of the last third of its samples over the median of the first third; the median
  of that over all compositions is the shift common to them, ``D``. With ``k = rounds / 3``
  rounds in each third and a level of log-sd ``sigma`` per round,
  ``var(D) = 2 sigma^2 / k``, so ``sigma = |log(1 + D)| sqrt(rounds / 6)`` (one
  observation: a rough figure). It does not average out over a run.
- **Per-step noise** (:class:`StepSpread`): the rest of each composition's measured
  spread, ``cv_step^2 = (std / mean)^2 - sigma^2``, independent from step to step. A step
  draws a mean-one log-normal factor whose log-variance is ``log(1 + cv_step^2)`` of a
  composition drawn at random among the profiled ones of its class: CUDA-graph decode
  steps, or eager steps of the same token-count class (:data:`EAGER_TOKEN_EDGES`: on the
  H200 profile the spread falls from 23% root mean square at up to 256 tokens, where a
  step is its launches and a new token count's first call, to 1% above 4,096). A run of
  ``m`` identical decode steps (priced once by the model) draws one factor for the run's
  mean, of variance ``cv^2 / m`` (``cv`` the root mean square of the class's): the sum is
  what a run's later steps and its tokens see, and it averages out as ``1 / sqrt(m)``.
- **The host's speed**, when the sidecar has a ``host_variation`` record (``schedsim
  profile llm --host-variation-s``): as at request level (:mod:`schedsim.run.bands`), the
  record's window timeline replayed (:class:`~schedsim.run.bands.HostTimeline`, the trace
  simulated on host time and read back on the wall clock), or for an older record without
  one, one log-normal factor per run (:func:`~schedsim.run.bands.host_sigma`).

The point estimate is the run on the model as fitted; replications draw from their own
seeds, so the same inputs and seed give the same band.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from schedsim.cost.protocols import StepCost
from schedsim.run.bands import _HOST_STREAM, HostTimeline, scaled_step_cost, trace_duration_s

_STEP_STREAM = 0x73746570  # "step": a replication's step-time draws, from its seed

EAGER_TOKEN_EDGES = (256, 1024, 4096)
"""Upper edges of the eager steps' token-count classes (a step's tokens computed; the last
class is open): a step draws its noise from profiled compositions of its own class."""

NO_HOST_RECORD = ("the host's speed between and within runs: the step profile's sidecar has no host_variation "
                  "record (schedsim profile llm --host-variation-s S measures one)")
"""The band record's ``absent`` entry when the profile has no host record."""


@dataclass(frozen=True)
class StepSpread:
    """The step profile's measured spread, split into per-step noise and a per-run level."""

    graph_log_sd: np.ndarray
    """Per profiled CUDA-graph decode composition: log-sd of one step's noise factor."""
    eager_log_sd: np.ndarray
    """Per profiled eager composition (any prefill, or more decodes than the largest graph)."""
    eager_tokens: np.ndarray
    """Tokens each of those compositions computes in a step."""
    graph_max: int
    """The largest captured decode batch (0: no graphs, every step is eager)."""
    level_sigma: float
    """Log-sd of the per-run level, from the sidecar's ``drift`` record (0 without one)."""
    rounds: int
    """Sampling rounds the level is read over."""

    @classmethod
    def from_profile(cls, profile) -> "StepSpread | None":
        """The spread of a :class:`~schedsim.cost.step_profile.StepProfile`; None when its
        table has no ``latency_ms_std`` (nothing measured to draw from)."""
        cols = profile.columns
        if "latency_ms_std" not in cols:
            return None
        mean = np.asarray(cols["latency_ms_mean"], dtype=np.float64)
        std = np.asarray(cols["latency_ms_std"], dtype=np.float64)
        ok = np.isfinite(mean) & np.isfinite(std) & (mean > 0) & (std >= 0)
        meta = profile.meta if isinstance(profile.meta, dict) else {}
        sampling = meta.get("sampling") if isinstance(meta.get("sampling"), dict) else {}
        rounds = int(sampling.get("rounds") or np.median(cols["n"]) or 0)
        drift = meta.get("drift") if isinstance(meta.get("drift"), dict) else {}
        change = drift.get("median_change")
        level = 0.0
        if isinstance(change, (int, float)) and math.isfinite(change) and change > -1 and rounds >= 3:
            level = abs(math.log1p(change)) * math.sqrt(rounds / 6.0)
        cv2 = np.maximum((std[ok] / mean[ok]) ** 2 - math.expm1(level ** 2), 0.0)
        log_sd = np.sqrt(np.log1p(cv2))
        graphs = profile.cuda_graph_batch_sizes
        graph_max = max(graphs) if graphs else 0
        prefill, decode = np.asarray(cols["prefill_seqs"]), np.asarray(cols["decode_seqs"])
        tokens = (prefill * np.asarray(cols["prefill_chunk"]) + decode)[ok]
        graph = ((prefill == 0) & (decode <= graph_max))[ok]
        return cls(log_sd[graph], log_sd[~graph], tokens[~graph].astype(np.int64), int(graph_max), float(level), rounds)

    @staticmethod
    def eager_class(tokens: int) -> int:
        """The token-count class of an eager step of ``tokens`` tokens (:data:`EAGER_TOKEN_EDGES`)."""
        return int(np.searchsorted(EAGER_TOKEN_EDGES, tokens))

    def classes(self) -> list[np.ndarray]:
        """Log-sds per class: the graph decode compositions, then each eager token-count class
        (a class the profile left empty borrows all eager compositions)."""
        cls = np.searchsorted(EAGER_TOKEN_EDGES, self.eager_tokens)
        eager = [self.eager_log_sd[cls == k] for k in range(len(EAGER_TOKEN_EDGES) + 1)]
        return [self.graph_log_sd] + [e if e.size else self.eager_log_sd for e in eager]

    def rms_cv(self, k: int) -> float:
        """Root mean square of one step's CV over class ``k`` of :meth:`classes` (0 when empty)."""
        s = self.classes()[k]
        return math.sqrt(float(np.mean(np.expm1(s ** 2)))) if s.size else 0.0

    def describe(self) -> str:
        names = ["graph decode"] + [f"eager <= {e:,}" for e in EAGER_TOKEN_EDGES] + \
            [f"eager > {EAGER_TOKEN_EDGES[-1]:,}"]
        parts = [f"{n} {100 * self.rms_cv(k):.1f}%" for k, n in enumerate(names)]
        return ("step-time draws (the step profile's measured spread per step, CV root mean square by "
                f"class of step and tokens: {', '.join(parts)})")

    def level_source(self) -> str:
        return (f"per-run level (the step profile's drift record over {self.rounds} rounds: log-sd "
                f"{self.level_sigma:.4f})")


class NoisyStepCost(StepCost):
    """``model`` (a :class:`~schedsim.cost.step_model.StepCostModel`) with each step's time
    times a draw of :class:`StepSpread`'s per-step noise, from ``rng``."""

    _BLOCK = 4096

    def __init__(self, model, spread: StepSpread, rng: np.random.Generator):
        self.model, self.spread, self.rng = model, spread, rng
        self.host_ns = model.host_ns
        self.draft_ns = model.draft_ns
        self._classes = spread.classes()
        self._cv2 = [spread.rms_cv(k) ** 2 for k in range(len(self._classes))]
        self._z: list = []
        self._u: list = []

    def _normal(self) -> float:
        if not self._z:
            self._z = self.rng.standard_normal(self._BLOCK).tolist()
        return self._z.pop()

    def _uniform(self) -> float:
        if not self._u:
            self._u = self.rng.random(self._BLOCK).tolist()
        return self._u.pop()

    def _class(self, rows: int, tokens: int) -> int:
        """Class (of :meth:`StepSpread.classes`) of a step of ``rows`` rows computing ``tokens``."""
        if tokens == rows and rows <= self.spread.graph_max:
            return 0   # decode-only, replayed as a graph
        return 1 + StepSpread.eager_class(tokens)

    def _one(self, k: int) -> float:
        """One step's factor: a profiled composition of class ``k``, then its log-normal."""
        s = self._classes[k]
        if not s.size:
            return 1.0
        sd = float(s[min(int(self._uniform() * s.size), s.size - 1)])
        return math.exp(sd * self._normal() - 0.5 * sd * sd)

    def _mean_of(self, k: int, m: int) -> float:
        """The factor of the mean of ``m`` independent steps of class ``k``."""
        cv2 = self._cv2[k] / max(m, 1)
        if cv2 <= 0:
            return 1.0
        sd = math.sqrt(math.log1p(cv2))
        return math.exp(sd * self._normal() - 0.5 * sd * sd)

    def step_ns(self, num_tokens: np.ndarray, context: np.ndarray, swap_blocks: int = 0) -> int:
        t = self.model.step_ns(num_tokens, context, swap_blocks)
        return max(1, round(t * self._one(self._class(num_tokens.shape[0], int(num_tokens.sum())))))

    def decode_run_segments(self, context: np.ndarray, k: int) -> tuple[list[int], list[int]]:
        counts, prices = self.model.decode_run_segments(context, k)
        cls = self._class(context.shape[0], context.shape[0])
        return counts, [max(1, round(p * self._mean_of(cls, c))) for c, p in zip(counts, prices)]

    def decode_run_ns(self, context: np.ndarray, k: int) -> np.ndarray:
        if k <= 0:
            return self.model.decode_run_ns(context, k)
        counts, prices = self.decode_run_segments(context, k)
        return np.repeat(np.array(prices, dtype=np.int64), counts)

    def begin_run(self) -> None:
        self.model.begin_run()


def noisy(cost, spread: StepSpread | None, seed: int):
    """``cost`` with its steps drawn from ``spread`` by a stream seeded by ``seed`` (``cost`` itself without a spread)."""
    if spread is None:
        return cost
    return NoisyStepCost(cost, spread, np.random.default_rng([seed, _STEP_STREAM]))


def on_host_path_llm(result, requests, path):
    """An LLM ``result`` simulated on ``path``'s host times, its times back on the wall clock
    and ``requests`` (the wall-clock arrivals) as its requests. The pooled inter-token gaps
    stay in host time (no band is drawn for ITL)."""
    wall = path.to_wall
    return dataclasses.replace(result, requests=requests, scheduled_ns=wall(result.scheduled_ns),
                               first_token_ns=wall(result.first_token_ns), end_ns=wall(result.end_ns),
                               step_start_ns=wall(result.step_start_ns), step_end_ns=wall(result.step_end_ns))


def llm_one(spec, trace, requests, policy, cost, summarize_kwargs: dict, spread: StepSpread | None = None):
    """``one`` for :func:`~schedsim.run.bands.compute_band` on an LLM run: the (possibly
    resampled) trace on the model with its steps drawn from ``spread``, on a slower host by
    the replication's factor, and on the host's measured timeline when the profile's
    record has one."""
    from schedsim.core.llm_metrics import summarize_llm
    from schedsim.core.llm_simulate import simulate_llm
    from schedsim.core.metrics import offered_rate
    from schedsim.core.policy import Requests
    from schedsim.run.bands import resample_arrivals

    warm_ns = int(round(spec.warmup_s * 1e9))
    timeline = HostTimeline.from_meta(cost.profile.meta)

    def one(seed: int, factor: float, arrivals_rng) -> dict:
        run_trace = trace if arrivals_rng is None else resample_arrivals(trace, arrivals_rng)
        reqs = requests if arrivals_rng is None else Requests.from_trace(run_trace)
        c = noisy(cost if factor == 1.0 else scaled_step_cost(cost, factor), spread, seed)
        if timeline is None:
            result = simulate_llm(reqs, policy, c, seed=seed, itl_from_ns=warm_ns)
        else:
            path = timeline.draw(np.random.default_rng([seed, _HOST_STREAM]),
                                 int(reqs.arrival_ns[0]) if len(reqs) else 0, trace_duration_s(run_trace))
            moved = Requests.from_trace(dataclasses.replace(run_trace, arrival_s=path.to_host(reqs.arrival_ns) / 1e9))
            result = simulate_llm(moved, policy, c, seed=seed, itl_from_ns=int(path.to_host(np.array([warm_ns]))[0]))
            result = on_host_path_llm(result, reqs, path)
        summary = summarize_llm(result, spec.warmup_s, **summarize_kwargs)
        summary["offered_rps"] = offered_rate(reqs.arrival_ns[reqs.arrival_ns >= warm_ns])
        return summary

    one.sources = [timeline.describe()] if timeline is not None else []
    return one
