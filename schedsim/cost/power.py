"""A power-capped GPU's clock: batches run slower after a spell of heavy work.

The H200 serving bert-base at batch 64 back to back draws its 700 W cap, and the
driver lowers the SM clock (1980 MHz idle-to-medium, 1860 MHz under batch 64) to stay
under it (`nvidia-smi`: throttle reason "SW power cap"). A batch of 32 then took 4.4%
longer on the GPU after batches of 64 than in the profile's mixed loop, and 1.2% less
after batches of 8 or 16 (experiments/fidelity/diagnose_gpu_load.py). A table measured
in a mixed loop prices every batch at the mix's clock; near saturation a live server runs
long spells of large batches at the lower clock, and the queue, which grows with any
service-time excess, shows it (experiments/fidelity/README.md).

A profile's sidecar may carry what was measured as ``power_cap``:

    {"batch": [8, 16, 32, 48, 64],         # back-to-back batches of this size ...
     "factor": [0.990, 0.988, 0.996, 1.017, 1.044],  # ... make a batch this much slower
                                            #     than in the reference state
     "tau_rise_ms": 24.5, "tau_fall_ms": 15,  # how fast the clock follows
     "table": "mix"}                        # the state the table's entries were measured in

``table`` says what the factors are relative to. ``"mix"`` (the default): the table was
measured in a loop of mixed batch sizes (experiments/default_profile/measure.py interleaves
them), and that loop's state is factor 1 for every entry. ``"steady"``: each entry was
measured with batches of its own size back to back (``schedsim profile`` runs cells one
after another), so the entry for b already carries factor(b), and a batch of b launched
at factor f takes the table's time times f / factor(b).

:class:`GpuClock` follows one GPU: while a batch of ``b`` samples runs, the factor moves
toward ``factor(b)`` (interpolated linearly in b, flat beyond the ends) with time
constant ``tau_rise_ms`` when it rises and ``tau_fall_ms`` when it falls; while the GPU
is idle it moves toward the smallest factor (the clock is uncapped). A batch's GPU time
is the table's draw times the factor at its launch (over its entry's own factor for a
``"steady"`` table). :func:`replay` runs the clock over a recorded run's batches;
:func:`step_tau_ms` fits a time constant from a measured step.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from schedsim.errors import InputError


class PowerCap:
    """The measured steady factors by batch size and the clock's time constants."""

    def __init__(self, batch, factor, *, tau_rise_ms: float, tau_fall_ms: float, table: str = "mix",
                 source: str = "power_cap"):
        try:
            b, f = list(map(float, batch)), list(map(float, factor))
        except (TypeError, ValueError):
            raise InputError(f"{source}: batch and factor must be lists of numbers") from None
        if not b or len(b) != len(f):
            raise InputError(f"{source}: batch and factor must be non-empty lists of the same length")
        if any(y <= x for x, y in zip(b, b[1:])) or not all(math.isfinite(v) and v > 0 for v in b):
            raise InputError(f"{source}: batch must be finite, > 0 and strictly increasing")
        if not all(math.isfinite(v) and v > 0 for v in f):
            raise InputError(f"{source}: factor must be finite numbers > 0")
        for name, v in (("tau_rise_ms", tau_rise_ms), ("tau_fall_ms", tau_fall_ms)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"{source}: {name} must be a number > 0, got {v!r}")
        if table not in ("mix", "steady"):
            raise InputError(f"{source}: table must be 'mix' or 'steady', got {table!r}")
        self.batch, self.factor, self.table = b, f, table
        self.tau_rise_ns, self.tau_fall_ns = tau_rise_ms * 1e6, tau_fall_ms * 1e6
        self.idle_factor = min(f)

    @classmethod
    def from_meta(cls, meta: dict, source: str) -> "PowerCap | None":
        """The sidecar's ``power_cap``, or None when it has none."""
        cap = meta.get("power_cap")
        if cap is None:
            return None
        if not isinstance(cap, dict):
            raise InputError(f"{source}: power_cap must be an object with batch, factor, tau_rise_ms, tau_fall_ms")
        return cls(cap.get("batch") or [], cap.get("factor") or [], tau_rise_ms=cap.get("tau_rise_ms"),
                   tau_fall_ms=cap.get("tau_fall_ms"), table=cap.get("table", "mix"),
                   source=f"{source}: power_cap")

    def steady(self, samples: int) -> float:
        """The factor back-to-back batches of ``samples`` settle at."""
        b, f = self.batch, self.factor
        i = bisect.bisect_left(b, samples)
        if i == 0:
            return f[0]
        if i == len(b):
            return f[-1]
        w = (samples - b[i - 1]) / (b[i] - b[i - 1])
        return f[i - 1] + w * (f[i] - f[i - 1])

    def table_factor(self, samples: int) -> float:
        """The factor the table's entry for ``samples`` was measured at (see ``table``)."""
        return 1.0 if self.table == "mix" else self.steady(samples)

    def describe(self) -> dict:
        return {"batch": self.batch, "factor": self.factor, "table": self.table,
                "tau_rise_ms": self.tau_rise_ns / 1e6, "tau_fall_ms": self.tau_fall_ns / 1e6}


class GpuClock:
    """One GPU's service-time factor over simulated time (nanoseconds).

    :meth:`launch` runs once per batch, so it keeps the state in slots and memoises the
    per-size factors (about 0.8 µs a batch on benchmarks/bench_run.py)."""

    __slots__ = ("cap", "factor", "at_ns", "busy_until", "busy_target", "_rise", "_fall", "_idle", "_sizes")

    def __init__(self, cap: PowerCap):
        self.cap = cap
        self.factor = cap.idle_factor  # a trace starts on a GPU that was idle
        self.at_ns = 0
        self.busy_until = 0       # the GPU runs batches until then ...
        self.busy_target = 1.0    # ... pulling the factor toward this
        self._rise, self._fall, self._idle = cap.tau_rise_ns, cap.tau_fall_ns, cap.idle_factor
        self._sizes: dict[int, tuple[float, float]] = {}  # samples -> (steady, table factor)

    def launch(self, now: int, samples: int) -> float:
        """What a batch of ``samples`` launched at ``now`` multiplies the table's time by (the
        clock's factor over the one its table entry was measured at); call :meth:`ran` with its end."""
        t = self.at_ns
        if now > t:
            # Busy toward the running batches' target until they end, then idle.
            f = self.factor
            busy_end = self.busy_until
            if busy_end > t:
                if busy_end > now:
                    busy_end = now
                target = self.busy_target
                f = target + (f - target) * math.exp((t - busy_end) / (self._rise if target > f else self._fall))
                t = busy_end
            if now > t:
                idle = self._idle
                f = idle + (f - idle) * math.exp((t - now) / (self._rise if idle > f else self._fall))
            self.factor, self.at_ns = f, now
        sizes = self._sizes.get(samples)
        if sizes is None:
            sizes = self._sizes[samples] = (self.cap.steady(samples), self.cap.table_factor(samples))
        # Concurrent batches (instances sharing the GPU): the heaviest sets the pull.
        self.busy_target = sizes[0] if self.busy_until <= now or sizes[0] > self.busy_target else self.busy_target
        return self.factor / sizes[1]

    def ran(self, end_ns: int) -> None:
        """The batch just launched keeps the GPU busy until ``end_ns``."""
        if end_ns > self.busy_until:
            self.busy_until = end_ns


def replay(cap: PowerCap, issue_s, done_s, samples) -> np.ndarray:
    """The multiplier :meth:`GpuClock.launch` gives each of a recorded run's batches (issue and
    completion times in seconds, in launch order): the model's clock over a live log."""
    clock, out = GpuClock(cap), []
    for issue, done, n in zip(issue_s, done_s, samples):
        out.append(clock.launch(int(issue * 1e9), int(n)))
        clock.ran(int(done * 1e9))
    return np.asarray(out)


def step_tau_ms(t_ms, ratio, start: float) -> float:
    """Time constant of a step response, by a grid search of least squares.

    ``ratio``: each batch's time after a change of load over where the times settle (1 once
    settled), at ``t_ms`` since the change; ``start``: the ratio the previous load left
    (its steady factor over the new one's). Fits 1 + (start - 1) e^(-t/tau), tau 0.5-200 ms.
    """
    t, r = np.asarray(t_ms, dtype=np.float64), np.asarray(ratio, dtype=np.float64)
    taus = np.arange(0.5, 200.0, 0.5)
    err = ((r[None, :] - (1 + (start - 1) * np.exp(-t[None, :] / taus[:, None]))) ** 2).sum(axis=1)
    return float(taus[int(np.argmin(err))])
