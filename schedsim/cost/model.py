"""The cost model: how long one batch takes on the GPU, from a measured profile."""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from schedsim.core.contention import PairSlowdown
from schedsim.errors import InputError
from schedsim.cost.power import PowerCap
from schedsim.cost.profile import Profile
from schedsim.cost.protocols import BatchCost
from schedsim.cost.wake import WakeCurve

QUANTILE_POINTS = 2001
"""Points of every precomputed quantile grid, at u = k / 2000: u = 0.5, 0.9 and 0.99 fall on the grid."""

SPREADS = ("auto", "empirical", "fitted", "none")

_MAX_ENTRIES = 200_000  # bound on the per-(samples, seq_len) cache; cleared when exceeded


class CostModel(BatchCost):
    """Service time of one batch: ``mean_s``/``sample_s(samples, seq_len)`` in seconds.

    What the model includes:

    - the measured GPU latency of a batch of ``samples`` samples (at ``seq_len`` when the
      profile depends on it), interpolated linearly between measured batch sizes and,
      bilinearly, between measured seq_lens; measured points are returned unchanged,
      even where noise makes the table slightly non-monotone;
    - its spread: each cell is a quantile function Q(u) (raw samples, "empirical"; or
      one fitted through the table's percentiles and shifted to its mean, "fitted");
      between cells the quantile functions are interpolated at the same u, so a draw
      at a given u never decreases with batch size when the cells are ordered;
    - sequence length: a batch's ``seq_len`` (the longest in the batch, as the driver pads)
      selects the grid row; tables without seq_len ignore it; ``seq_len`` 0 means "not
      given" and uses the profile's seq_len when it measured only one, else is refused;
    - a per-batch host dispatch overhead, added to every batch: a constant plus, when the
      profile measured it (``dispatch_overhead_us_per_sample``), a term per sample beyond
      the first (a serving loop's bookkeeping and input gathering grow with the batch);
    - optionally (``extrapolate=True``) linear extrapolation beyond the measured range
      from the last two points, never below the smallest measured latency.

    What the driver adds (it follows state across batches): the wake-up of an idle
    serving loop (``wake_ns``), batches sharing the GPU (the ``pair_slowdown`` grid,
    :mod:`schedsim.core.contention`, or else ``at_concurrency``), and a
    power-capped GPU's clock (``power_cap``, :mod:`schedsim.cost.power`).

    What it does not include: anything else that depends on other batches or on time
    (queueing, concurrent kernels or streams, thermals beyond the power cap, warm-up and
    cold-start costs, memory pressure), host work per request (tokenisation,
    (de)serialisation, network), padding cost beyond what seq_len captures, and
    correlation between consecutive batches: draws are independent. It knows nothing of
    policies.

    Randomness: every ``sample_s`` call consumes exactly one ``rng.random()`` whatever
    the spread, so two runs that share a seed see the same random stream even with
    different spreads (common random numbers), and ``sample_many_s`` of n batches draws
    bit-for-bit what n ``sample_s`` calls would.

    It declares every capability of :class:`~schedsim.cost.protocols.BatchCost`.
    """

    one_draw_per_sample = True

    def __init__(self, profile: Profile, *, spread: str = "auto", extrapolate: bool = False,
                 dispatch_overhead_s: float | None = None, max_seq_len: int | None = None,
                 wake_overhead_s: float | None = None, dispatch_per_sample_s: float | None = None,
                 power_cap: bool = True):
        """Prefer :meth:`from_profile`; the arguments are the same."""
        if spread not in SPREADS:
            raise InputError(f"spread: {spread!r} is not one of {', '.join(SPREADS)}")
        if dispatch_per_sample_s is None:
            # An explicit constant overhead replaces the measured one, per-sample term included.
            dispatch_per_sample_s = 0.0 if dispatch_overhead_s is not None else \
                float(profile.meta.get("dispatch_overhead_us_per_sample", 0.0)) * 1e-6
        if dispatch_overhead_s is None:
            dispatch_overhead_s = float(profile.meta.get("dispatch_overhead_us", 0.0)) * 1e-6
        for name, v in (("dispatch_overhead_s", dispatch_overhead_s), ("dispatch_per_sample_s", dispatch_per_sample_s)):
            try:
                ok = math.isfinite(float(v)) and float(v) >= 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise InputError(f"{name}: {v!r} must be a number >= 0 (seconds)")
        # An explicit constant wins; else the sidecar's measured curve; else its constant.
        self.wake_curve = None if wake_overhead_s is not None else WakeCurve.from_meta(profile.meta, profile.source)
        if wake_overhead_s is None:
            wake_overhead_s = float(profile.meta.get("wake_overhead_us", 0.0)) * 1e-6
        self.power_cap = PowerCap.from_meta(profile.meta, profile.source) if power_cap else None
        """The GPU clock's response to recent load (:mod:`schedsim.cost.power`), when the profile measured
        it; the driver follows it per GPU and scales each batch's time past dispatch."""
        self.pair_slowdown = PairSlowdown.from_meta(profile.meta, profile.source)
        """How a batch slows beside another instance's batch by both sizes (instances sharing a GPU,
        :mod:`schedsim.core.contention`), when the profile measured it."""
        if not (isinstance(wake_overhead_s, (int, float)) and math.isfinite(wake_overhead_s) and wake_overhead_s >= 0):
            raise InputError(f"wake_overhead_s: {wake_overhead_s!r} must be a number >= 0 (seconds)")
        if max_seq_len is not None and (int(max_seq_len) != max_seq_len or max_seq_len < 1):
            raise InputError(f"max_seq_len: {max_seq_len!r} must be an integer >= 1")
        if spread == "auto":
            if profile.samples is not None:
                spread = "empirical"
            elif (profile.columns["latency_ms_std"] > 0).any():
                spread = "fitted"
            else:
                spread = "none"
        if spread == "empirical" and profile.samples is None:
            raise InputError(f"{profile.source}: spread 'empirical' needs raw samples, and this profile has "
                             "none; use spread 'fitted' or 'auto'")

        self.profile = profile
        self.spread = spread
        """The spread in use: 'empirical', 'fitted' or 'none' ('auto' resolved)."""
        self.extrapolate = bool(extrapolate)
        self.dispatch_overhead_s = float(dispatch_overhead_s)
        """Host dispatch overhead of a batch of one sample."""
        self.dispatch_per_sample_s = float(dispatch_per_sample_s)
        """Added to the dispatch overhead per sample beyond the first."""
        self.wake_overhead_s = float(wake_overhead_s)
        """Extra time of a batch that wakes an idle serving loop (not launched at the instant its
        instance finished the previous one): thread wake-ups and a cooled host. The driver adds
        :meth:`wake_ns`; this constant is used when there is no ``wake_curve``."""
        self.max_seq_len = None if max_seq_len is None else int(max_seq_len)
        self.has_seq_len = profile.has_seq_len
        self.batches = profile.batches
        self.seq_lens = profile.seq_lens
        self._b = self.batches.tolist()
        self._s = self.seq_lens.tolist()
        self._mean_ms = profile.column("latency_ms_mean")  # (n_seq, n_batch)
        self._grid_ms = None if spread == "none" else self._cell_grids(profile, spread)
        self._rows: dict = {}     # (seq index, batch) -> (mean_ms, grid_ms or None)
        self._entries: dict = {}  # (samples, seq_len) -> see _entry
        self._km1 = float(QUANTILE_POINTS - 1)
        self._concurrent: dict[int, CostModel] = {}

    @classmethod
    def from_profile(cls, profile: Profile, *, spread: str = "auto", extrapolate: bool = False,
                     dispatch_overhead_s: float | None = None, max_seq_len: int | None = None,
                     wake_overhead_s: float | None = None,
                     dispatch_per_sample_s: float | None = None, power_cap: bool = True) -> "CostModel":
        """Build the model from a profile.

        ``spread``: 'empirical' (raw samples), 'fitted' (table percentiles), 'none' (always
        the mean) or 'auto' (empirical when samples exist, else fitted when any std > 0,
        else none). ``extrapolate``: allow batch sizes and seq_lens outside the measured
        range. ``dispatch_overhead_s``: per-batch host overhead added to every batch;
        None takes the sidecar's ``dispatch_overhead_us`` (0 when absent).
        ``dispatch_per_sample_s``: added per sample beyond the first; None takes the
        sidecar's ``dispatch_overhead_us_per_sample``, or 0 when ``dispatch_overhead_s`` is
        given (an explicit overhead replaces the measured one). ``max_seq_len``:
        the model's longest input; longer requests are truncated to it before lookup.
        ``wake_overhead_s``: extra time of a batch launched on an instance that sat idle
        (the serving loop had to wake up), one constant; None takes the sidecar's
        ``wake_curve`` (extra time by idle time, :mod:`schedsim.cost.wake`) or else its
        ``wake_overhead_us`` (0 when both are absent). ``power_cap``: follow the sidecar's
        ``power_cap`` (a power-capped GPU slows after heavy batches, :mod:`schedsim.cost.power`)
        when it has one; False prices every batch at the profile loop's clock.
        """
        return cls(profile, spread=spread, extrapolate=extrapolate,
                   dispatch_overhead_s=dispatch_overhead_s, max_seq_len=max_seq_len,
                   wake_overhead_s=wake_overhead_s, dispatch_per_sample_s=dispatch_per_sample_s,
                   power_cap=power_cap)

    def wake_ns(self, idle_ns: int, u: float = 0.5) -> int:
        """Extra nanoseconds of a launch on an instance idle for ``idle_ns``; ``u`` in [0, 1) is
        the draw a curve with quantiles uses (see :attr:`wake_is_random`)."""
        if self.wake_curve is not None:
            return self.wake_curve.extra_ns(idle_ns, u)
        return int(round(self.wake_overhead_s * 1e9))

    @property
    def wake_is_random(self) -> bool:
        """Whether :meth:`wake_ns` depends on its draw: the driver then draws one per wake-up."""
        return self.wake_curve is not None and self.wake_curve.random

    def with_contention(self, concurrent: dict) -> "CostModel":
        """Attach cost models measured with several instances running at once on one GPU
        (``{2: CostModel of a profile measured with --instances 2, ...}``); see :meth:`at_concurrency`."""
        self._concurrent = {int(k): v for k, v in concurrent.items() if int(k) > 1}
        return self

    def at_concurrency(self, instances_busy: int) -> "CostModel":
        """The model for a batch launched while ``instances_busy`` instances (itself included)
        run on the GPU: the attached model with the largest concurrency not above it, else this
        one. Concurrency is taken at launch; later starts and ends are not followed."""
        best = self
        for k, model in sorted(self._concurrent.items()):
            if k <= instances_busy:
                best = model
        return best

    def __repr__(self) -> str:
        return (f"CostModel({self.profile.source!r}, spread={self.spread!r}, extrapolate={self.extrapolate}, "
                f"dispatch_overhead_s={self.dispatch_overhead_s!r}, "
                f"dispatch_per_sample_s={self.dispatch_per_sample_s!r})")

    # ------------------------------------------------------------------ public queries

    @property
    def max_batch(self) -> int:
        """Largest measured batch size."""
        return self._b[-1]

    @property
    def min_batch(self) -> int:
        """Smallest measured batch size."""
        return self._b[0]

    def dispatch_s(self, samples: int) -> float:
        """The host dispatch overhead of a batch of ``samples`` samples, in seconds."""
        return self.dispatch_overhead_s + self.dispatch_per_sample_s * (samples - 1)

    def mean_s(self, samples: int, seq_len: int = 0) -> float:
        """Mean service time in seconds (the table's mean, interpolated, plus dispatch overhead)."""
        e = self._entries.get((samples, seq_len))
        if e is None:
            e = self._entry(samples, seq_len)
        return e[0]

    def sample_s(self, samples: int, seq_len: int, rng: np.random.Generator) -> float:
        """One random service time in seconds; consumes exactly one ``rng.random()``."""
        e = self._entries.get((samples, seq_len))
        if e is None:
            e = self._entry(samples, seq_len)
        u = rng.random()
        q0 = e[2]
        if q0 is None:
            return e[1]
        x = u * self._km1
        i = int(x)
        f = x - i
        g = 1.0 - f
        v = g * q0[i] + f * q0[i + 1]
        q1 = e[3]
        if q1 is not None:
            w = e[4]
            v = (1.0 - w) * v + w * (g * q1[i] + f * q1[i + 1])
        return v

    def quantile_s(self, samples: int, seq_len: int, u: float) -> float:
        """The service time at probability ``u`` in [0, 1): what ``sample_s`` returns when the draw is u."""
        if not 0.0 <= u < 1.0:
            raise ValueError(f"u={u!r} must be in [0, 1)")
        return self.sample_s(samples, seq_len, _Fixed(u))

    def sample_many_s(self, samples, seq_len, rng: np.random.Generator) -> np.ndarray:
        """Vectorised ``sample_s``: equal to calling it once per element, in order, bit for bit."""
        samples, seq_len = np.broadcast_arrays(np.asarray(samples), np.asarray(seq_len))
        samples, seq_len = samples.ravel(), seq_len.ravel()
        u = rng.random(samples.size)
        out = np.empty(samples.size, np.float64)
        if samples.size == 0:
            return out
        x = u * self._km1
        idx = x.astype(np.int64)
        f = x - idx
        g = 1.0 - f
        b64, s64 = samples.astype(np.int64), seq_len.astype(np.int64)
        if (b64 != samples).any() or (s64 != seq_len).any() or (b64 < 0).any() or (s64 < 0).any():
            raise ValueError("samples and seq_len must be non-negative integers")
        keys, inverse = np.unique((b64 << 32) | s64, return_inverse=True)  # one int64 key per pair
        inverse = inverse.ravel()
        entries = [self._entries.get((b, s)) or self._entry(b, s)
                   for b, s in zip((keys >> 32).tolist(), (keys & 0xFFFFFFFF).tolist())]
        is_const = np.array([e[2] is None for e in entries])
        const = np.array([e[1] if e[2] is None else 0.0 for e in entries])
        zero = np.zeros(QUANTILE_POINTS)
        g0 = np.stack([zero if e[2] is None else np.asarray(e[2]) for e in entries])
        v = g * g0[inverse, idx] + f * g0[inverse, idx + 1]
        blended = np.array([e[3] is not None for e in entries])
        if blended.any():
            g1 = np.stack([np.asarray(e[3]) if e[3] is not None else zero for e in entries])
            w = np.array([e[4] for e in entries])[inverse]
            m = blended[inverse]
            r, ii = inverse[m], idx[m]
            v[m] = (1.0 - w[m]) * v[m] + w[m] * (g[m] * g1[r, ii] + f[m] * g1[r, ii + 1])
        c = is_const[inverse]
        v[c] = const[inverse[c]]
        out[:] = v
        return out

    def covers(self, samples: int, seq_len: int = 0) -> bool:
        """Whether the measured range covers this batch (interpolation only, whatever ``extrapolate`` says)."""
        if not self._b[0] <= samples <= self._b[-1]:
            return False
        if not self.has_seq_len:
            return True
        s = self._clamp(seq_len)
        return self._s[0] <= s <= self._s[-1]

    def check_covers(self, max_samples: int, seq_lens=(), what: str = "--max-batch-size",
                     seq_what: str = "the trace") -> None:
        """Raise InputError unless every batch of 1..max_samples samples at every seq_len in
        ``seq_lens`` is inside the measured range (or ``extrapolate`` is on).

        ``what`` names where max_samples came from (a flag), ``seq_what`` where the seq_lens did.
        """
        if self.extrapolate:
            return
        src, lo, hi = self.profile.source, self._b[0], self._b[-1]
        if max_samples > hi:
            raise InputError(f"profile {src} covers batch sizes {lo}..{hi}, but the policy may launch batches "
                             f"of {max_samples} samples ({what}); pass --extrapolate or measure larger batches")
        if lo > 1:
            raise InputError(f"profile {src} covers batch sizes {lo}..{hi}, but the policy may launch batches "
                             f"of 1 sample ({what}); pass --extrapolate or measure smaller batches")
        if not self.has_seq_len or seq_lens is None:
            return
        arr = np.asarray(seq_lens, dtype=np.int64).ravel()
        if arr.size == 0:
            return
        smin, smax = self._clamp(int(arr.min())), self._clamp(int(arr.max()))
        slo, shi = self._s[0], self._s[-1]
        if smin == 0:  # only reached with several measured seq_lens (see _clamp)
            raise InputError(f"profile {src} depends on seq_len (measured {slo}..{shi}), but {seq_what} has "
                             "requests without a seq_len (0); give every request a seq_len")
        if smax > shi:
            raise InputError(f"profile {src} covers seq_len {slo}..{shi}, but {seq_what} has seq_len up to "
                             f"{smax}; pass --extrapolate or measure longer sequences")
        if smin < slo:
            raise InputError(f"profile {src} covers seq_len {slo}..{shi}, but {seq_what} has seq_len down to "
                             f"{smin}; pass --extrapolate or measure shorter sequences")

    # ------------------------------------------------------------------ construction

    @staticmethod
    def _cell_grids(profile: Profile, spread: str) -> np.ndarray:
        """Quantile grid per measured cell, ms, shape (n_seq, n_batch, K)."""
        u = np.linspace(0.0, 1.0, QUANTILE_POINTS)
        seqs, batches = profile.seq_lens.tolist(), profile.batches.tolist()
        out = np.empty((len(seqs), len(batches), QUANTILE_POINTS))
        if spread == "empirical":
            for j, s in enumerate(seqs):
                for k, b in enumerate(batches):
                    out[j, k] = _empirical_grid(profile.samples[(b, s)], u)
            return out
        col = profile.column
        p50, p90, p99 = col("latency_ms_p50"), col("latency_ms_p90"), col("latency_ms_p99")
        mean, std = col("latency_ms_mean"), col("latency_ms_std")
        has = profile.columns
        lo = col("latency_ms_min") if "latency_ms_min" in has else np.maximum(2 * p50 - p90, 1e-3 * p50)
        hi = col("latency_ms_max") if "latency_ms_max" in has else p99 + (p99 - p90)
        knots_u = np.array([0.0, 0.5, 0.9, 0.99, 1.0])
        for j in range(len(seqs)):
            for k in range(len(batches)):
                m = mean[j, k]
                if std[j, k] == 0 or lo[j, k] == hi[j, k]:
                    out[j, k] = m  # zero spread: deterministic, exactly the mean
                    continue
                q = np.interp(u, knots_u, [lo[j, k], p50[j, k], p90[j, k], p99[j, k], hi[j, k]])
                q_mean = _grid_mean(q)
                shifted = q + (m - q_mean)
                # A shift keeps the percentile gaps; when it would make service times
                # non-positive (very skewed cells), scale instead, which keeps them positive.
                out[j, k] = np.maximum.accumulate(shifted if shifted[0] > 0 else q * (m / q_mean))
        return out

    def _clamp(self, seq_len: int) -> int:
        """The seq_len to look up: truncated to max_seq_len; 0 ("not given") is the
        measured seq_len when the profile has only one, and stays 0 (uncovered) otherwise."""
        if self.max_seq_len is not None and seq_len > self.max_seq_len:
            return self.max_seq_len
        if seq_len == 0 and len(self._s) == 1:
            return self._s[0]
        return seq_len

    def _row(self, j: int, b: int):
        """(mean_ms, grid_ms, grid_s) at seq row j and batch b, interpolated along batch;
        grid_s (seconds, overhead included) is a memoryview shared by every entry that uses it."""
        key = (j, b)
        r = self._rows.get(key)
        if r is not None:
            return r
        i0, i1, w, inside = _bracket(b, self._b)
        m = self._mean_ms[j]
        grids = self._grid_ms
        mean = _lerp_along(m[i0], m[i1], w, inside, floor=m.min())
        grid = None
        if grids is not None:
            grid = _lerp_along(grids[j, i0], grids[j, i1], w, inside, floor=grids[j].min(axis=0))
            if not inside:
                grid = np.maximum.accumulate(grid)  # extrapolated spreads may cross; keep Q monotone
        r = (mean, grid, None if grid is None else _seconds(grid, self.dispatch_s(b)))
        self._rows[key] = r
        return r

    def _entry(self, samples, seq_len):
        """Build and cache (mean_s, constant draw or None, q0, q1, w) for one (samples, seq_len):
        a draw is the constant when q0 is None, else q0 (blended with q1 at weight w) at u."""
        key = (samples, seq_len)
        if samples != int(samples) or samples < 1:
            raise ValueError(f"samples={samples!r}: a batch holds an integer number >= 1 of samples")
        b = int(samples)
        if not self.extrapolate and not self._b[0] <= b <= self._b[-1]:
            raise ValueError(f"profile {self.profile.source} covers batch sizes {self._b[0]}..{self._b[-1]}, "
                             f"not {b} (call check_covers first, or build the model with extrapolate=True)")
        ov = self.dispatch_s(b)
        if self.has_seq_len:
            s = self._clamp(int(seq_len))
            j0, j1, ws, inside = _bracket(s, self._s)
            if not self.extrapolate and not inside:
                raise ValueError(f"profile {self.profile.source} covers seq_len {self._s[0]}..{self._s[-1]}, "
                                 f"not {s} (call check_covers first, or build the model with extrapolate=True)")
        else:
            j0 = j1 = 0
            ws, inside = 0.0, True
        m0, g0, q0 = self._row(j0, b)
        q1 = None
        if ws == 0.0:
            mean_ms = m0
        elif inside:
            m1, _, q1 = self._row(j1, b)
            mean_ms = _blend(m0, m1, ws)
        else:
            # Extrapolating in seq_len: build the grid once, floored at the batch's smallest measured latency.
            rows = [self._row(j, b) for j in range(len(self._s))]
            m1, g1, _ = rows[j1]
            mean_ms = max(m0 + ws * (m1 - m0), min(r[0] for r in rows))
            if g0 is not None:
                floor = np.min([r[1] for r in rows], axis=0)
                q0 = _seconds(np.maximum.accumulate(np.maximum(g0 + ws * (g1 - g0), floor)), ov)
        mean_s = float(mean_ms) / 1000.0 + ov
        if q0 is None:
            e = (mean_s, mean_s, None, None, 0.0)
        elif q0[0] == q0[-1] and (q1 is None or q1[0] == q1[-1]):
            # Zero spread: skip the interpolation arithmetic so the draw is exact. A fitted
            # constant cell is its mean; an empirical one is its (float32) samples' value.
            c = q0[0] if q1 is None else (1.0 - ws) * q0[0] + ws * q1[0]
            e = (mean_s, mean_s if self.spread == "fitted" else c, None, None, 0.0)
        else:
            e = (mean_s, None, q0, q1, ws)
        if len(self._entries) >= _MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = e
        return e


class _Fixed:
    """Stands in for a Generator whose next ``random()`` is a given u (for quantile_s)."""

    __slots__ = ("u",)

    def __init__(self, u: float):
        self.u = float(u)

    def random(self) -> float:
        return self.u


def _bracket(x, xs: list):
    """(i0, i1, w, inside): x = xs[i0] + w * (xs[i1] - xs[i0]); w = 0 exactly at a measured point."""
    n = len(xs)
    k = bisect_right(xs, x) - 1
    if k >= 0 and xs[k] == x:
        return k, k, 0.0, True
    if n == 1:
        return 0, 0, 0.0, False  # one point: extrapolation is constant
    if k < 0:
        i0, i1 = 0, 1
    elif k >= n - 1:
        i0, i1 = n - 2, n - 1
    else:
        i0, i1 = k, k + 1
    w = (x - xs[i0]) / (xs[i1] - xs[i0])
    return i0, i1, w, 0 <= k < n - 1


def _lerp_along(v0, v1, w: float, inside: bool, floor):
    """Interpolate along batch size: v0 + w (v1 - v0), monotone in w; clamped to the bracket
    inside (so rounding never overshoots the next measured point), floored outside."""
    if w == 0.0:
        return v0
    v = v0 + w * (v1 - v0)
    if inside:
        return np.minimum(np.maximum(v, np.minimum(v0, v1)), np.maximum(v0, v1)) if isinstance(v, np.ndarray) \
            else min(max(v, min(v0, v1)), max(v0, v1))
    return np.maximum(v, floor) if isinstance(v, np.ndarray) else max(v, float(floor))


def _blend(v0: float, v1: float, w: float) -> float:
    """Interpolate across seq_len: (1 - w) v0 + w v1 is monotone in v0 and v1, so monotone in batch."""
    v = (1.0 - w) * v0 + w * v1
    return min(max(v, min(v0, v1)), max(v0, v1))


def _empirical_grid(x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Q(u) of sorted samples, linear between order statistics (numpy's default 'linear'
    method), written as (1 - t) x[k] + t x[k+1] so that it is exactly monotone in the
    samples: cells whose sorted samples are ordered get ordered grids, bit for bit."""
    h = (x.size - 1) * u
    k = np.minimum(h.astype(np.int64), x.size - 1)
    t = h - k
    q = (1.0 - t) * x[k] + t * x[np.minimum(k + 1, x.size - 1)]
    return np.maximum.accumulate(q)


def _grid_mean(q: np.ndarray) -> float:
    """Mean of the distribution drawn by linear interpolation on the grid (trapezoid rule)."""
    return float((q[:-1] + q[1:]).sum() / (2.0 * (q.size - 1)))


def _seconds(grid_ms: np.ndarray, overhead_s: float) -> memoryview:
    # A memoryview indexes to Python floats without copying, faster than numpy scalar indexing.
    return memoryview(np.ascontiguousarray(grid_ms / 1000.0 + overhead_s))
