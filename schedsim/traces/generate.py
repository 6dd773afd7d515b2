"""Synthetic request traces.

Arrival processes return float64 arrival times (seconds, first arrival after 0) for
either ``n`` requests or everything before ``duration_s``. Every function takes an
explicit ``np.random.Generator``; the same generator state gives bit-identical output.

Length distributions are written as spec strings so the CLI and configs share them:

- ``fixed:V``                  always V
- ``uniform:LO:HI``            integers LO..HI inclusive
- ``lognormal:MEAN:SIGMA``     MEAN of the distribution (not of its log), SIGMA of the
                               log; rounded to integers >= 1 (heavy-tailed prompt lengths)
- ``resample:PATH[:COLUMN]``   bootstrap from a trace file's column (default: the column
                               being generated)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from schedsim.errors import InputError
from schedsim.traces.io import load_trace
from schedsim.traces.table import Trace

__all__ = [
    "ARRIVALS", "LENGTH_COLUMNS", "LengthDist", "poisson", "gamma", "onoff", "diurnal",
    "arrival_times", "parse_length", "make_trace", "generate",
]

LENGTH_COLUMNS = ("batch", "seq_len", "input_tokens", "output_tokens")
_I32_MAX = np.iinfo(np.int32).max


# ------------------------------------------------------------------ arrival processes

def _positive(name: str, value, *, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name}: {value!r} is not a number") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InputError(f"{name}: {value!r} must be a finite number {bound}")
    return v


def _count_or_duration(n, duration_s) -> tuple[int | None, float | None]:
    if (n is None) == (duration_s is None):
        raise InputError("give exactly one of n (requests) or duration_s (seconds)")
    if n is not None:
        if isinstance(n, bool) or int(n) != n or n < 0:
            raise InputError(f"n: {n!r} must be a whole number >= 0")
        return int(n), None
    return None, _positive("duration_s", duration_s)


def _chunked(next_chunk: Callable[[int], np.ndarray], first: int, n, duration_s) -> np.ndarray:
    """Concatenate increasing chunks until ``n`` arrivals or one at/after ``duration_s``.

    ``next_chunk(size)`` continues the process from where the last chunk ended. Chunk
    sizes depend only on the parameters, so the draws (and output) do not vary by run.
    """
    parts, count = [], 0
    size = max(int(first), 16)
    while True:
        chunk = next_chunk(size)
        parts.append(chunk)
        count += chunk.size
        if n is not None and count >= n:
            return np.concatenate(parts)[:n]
        if duration_s is not None and chunk.size and chunk[-1] >= duration_s:
            out = np.concatenate(parts)
            return out[: np.searchsorted(out, duration_s, side="left")]
        size = max(size // 4, 1024)


def _expected_chunk(mean: float) -> int:
    # Mean plus six standard deviations of a Poisson count: one chunk almost always.
    return int(mean + 6.0 * math.sqrt(mean) + 16)


def _renewal(rng: np.random.Generator, gaps: Callable[[int], np.ndarray], rate: float,
             n, duration_s) -> np.ndarray:
    if n is not None:
        return np.cumsum(gaps(n)) if n else np.empty(0)
    t0 = 0.0

    def next_chunk(size):
        nonlocal t0
        t = t0 + np.cumsum(gaps(size))
        t0 = float(t[-1])
        return t

    return _chunked(next_chunk, _expected_chunk(rate * duration_s), None, duration_s)


def poisson(rate: float, *, rng: np.random.Generator, n: int | None = None,
            duration_s: float | None = None) -> np.ndarray:
    """Poisson arrivals: exponential inter-arrival times with mean ``1/rate``."""
    rate = _positive("rate", rate)
    n, duration_s = _count_or_duration(n, duration_s)
    return _renewal(rng, lambda k: rng.exponential(1.0 / rate, k), rate, n, duration_s)


def gamma(rate: float, cv: float, *, rng: np.random.Generator, n: int | None = None,
          duration_s: float | None = None) -> np.ndarray:
    """Gamma renewal arrivals with mean gap ``1/rate`` and gap CV ``cv``.

    Shape ``1/cv**2`` as vLLM's benchmark "burstiness" does: cv=1 is Poisson, cv>1
    bursty, cv=0 a fixed interval.
    """
    rate = _positive("rate", rate)
    cv = _positive("cv", cv, allow_zero=True)
    n, duration_s = _count_or_duration(n, duration_s)
    if cv == 0:
        draw = lambda k: np.full(k, 1.0 / rate)  # noqa: E731
    else:
        shape = 1.0 / cv**2
        draw = lambda k: rng.gamma(shape, 1.0 / (rate * shape), k)  # noqa: E731
    return _renewal(rng, draw, rate, n, duration_s)


def onoff(rate_on: float, on_s: float, off_s: float, *, rng: np.random.Generator,
          rate_off: float = 0.0, n: int | None = None, duration_s: float | None = None) -> np.ndarray:
    """Poisson at ``rate_on`` for ``on_s`` seconds, then ``rate_off`` (default silent) for
    ``off_s``, repeating from an on period at t=0.

    Exact and vectorised by time change: unit-rate Poisson points in "expected count"
    time are mapped back through the piecewise-linear cumulative rate.
    """
    rate_on = _positive("rate_on", rate_on)
    on_s = _positive("on_s", on_s)
    off_s = _positive("off_s", off_s, allow_zero=True)
    rate_off = _positive("rate_off", rate_off, allow_zero=True)
    n, duration_s = _count_or_duration(n, duration_s)
    cycle = on_s + off_s
    mass_on = rate_on * on_s
    mass = mass_on + rate_off * off_s

    def to_time(u):
        k = np.floor(u / mass)
        r = u - k * mass
        if rate_off > 0:
            t = np.where(r < mass_on, r / rate_on, on_s + (r - mass_on) / rate_off)
        else:  # clip so rounding can never put an arrival in a silent period
            t = np.clip(r, 0.0, mass_on) / rate_on
        # floor() at cycle edges may wobble by an ulp; keep the output sorted.
        return np.maximum.accumulate(k * cycle + t)

    if n is not None:
        return to_time(np.cumsum(rng.exponential(1.0, n))) if n else np.empty(0)
    k, r = divmod(duration_s, cycle)
    total = k * mass + min(r, on_s) * rate_on + max(r - on_s, 0.0) * rate_off
    u = _renewal(rng, lambda m: rng.exponential(1.0, m), 1.0, None, total)
    t = to_time(u)
    return t[t < duration_s]


def diurnal(mean_rate: float, amplitude: float, period_s: float, *, rng: np.random.Generator,
            n: int | None = None, duration_s: float | None = None) -> np.ndarray:
    """Nonhomogeneous Poisson with rate ``mean_rate * (1 + amplitude * sin(2 pi t / period_s))``.

    Sampled by thinning (Lewis & Shedler): Poisson candidates at the peak rate, each
    kept with probability rate(t) / peak.
    """
    mean_rate = _positive("mean_rate", mean_rate)
    amplitude = _positive("amplitude", amplitude, allow_zero=True)
    if amplitude > 1:
        raise InputError(f"amplitude: {amplitude!r} must be between 0 and 1 (the rate cannot go negative)")
    period_s = _positive("period_s", period_s)
    n, duration_s = _count_or_duration(n, duration_s)
    if n == 0:
        return np.empty(0)
    peak = mean_rate * (1.0 + amplitude)
    t0 = 0.0

    def next_chunk(size):
        nonlocal t0
        cand = t0 + np.cumsum(rng.exponential(1.0 / peak, size))
        t0 = float(cand[-1])
        keep = rng.random(size) * peak < mean_rate * (1.0 + amplitude * np.sin(2 * np.pi * cand / period_s))
        out = cand[keep]
        # Let _chunked see how far this chunk reached even if its last candidate was dropped.
        if duration_s is not None and t0 >= duration_s and (out.size == 0 or out[-1] < duration_s):
            out = np.append(out, t0)
        return out

    first = n * (1.0 + amplitude) if n is not None else peak * duration_s
    return _chunked(next_chunk, _expected_chunk(first) + (n or 0) // 20, n, duration_s)


ARRIVALS = {"poisson": poisson, "gamma": gamma, "onoff": onoff, "diurnal": diurnal}
"""Arrival process name -> function."""

_PARAMS = {
    "poisson": ("rate",),
    "gamma": ("rate", "cv"),
    "onoff": ("rate", "on_s", "off_s"),
    "diurnal": ("rate", "amplitude", "period_s"),
}


MAX_REQUESTS = 200_000_000
"""Largest trace :func:`arrival_times` makes (about 1.6 GB per float64 column)."""


def _check_size(kind, n, duration_s, rate, rate_off, amplitude) -> None:
    """Refuse, before drawing anything, a trace too large to hold in memory."""
    if n is not None:
        expected, flag = float(n), "n"
    else:
        try:
            peak = max(float(rate), float(rate_off or 0.0)) * (1.0 + float(amplitude or 0.0))
            expected, flag = peak * float(duration_s), "rate x duration_s"
        except (TypeError, ValueError):
            return  # the process's own checks word the bad value
    if expected > MAX_REQUESTS:
        raise InputError(f"{flag}: {kind} arrivals would make about {expected:,.0f} requests; "
                         f"at most {MAX_REQUESTS:,} fit in memory")


def arrival_times(kind: str, *, rng: np.random.Generator, n: int | None = None,
                  duration_s: float | None = None, rate: float | None = None,
                  cv: float | None = None, on_s: float | None = None, off_s: float | None = None,
                  rate_off: float = 0.0, amplitude: float | None = None,
                  period_s: float | None = None) -> np.ndarray:
    """Dispatch by process name with flat parameters, as the CLI passes them.

    ``rate`` is the Poisson/gamma rate, the on-period rate of ``onoff`` and the mean
    rate of ``diurnal``.
    """
    if kind not in ARRIVALS:
        raise InputError(f"arrival process {kind!r}: unknown; choose one of {', '.join(ARRIVALS)}")
    given = {"rate": rate, "cv": cv, "on_s": on_s, "off_s": off_s, "amplitude": amplitude,
             "period_s": period_s}
    missing = [p for p in _PARAMS[kind] if given[p] is None]
    if missing:
        raise InputError(f"arrival process {kind!r} needs {', '.join(missing)}")
    _check_size(kind, n, duration_s, rate, rate_off, amplitude)
    if kind == "poisson":
        return poisson(rate, rng=rng, n=n, duration_s=duration_s)
    if kind == "gamma":
        return gamma(rate, cv, rng=rng, n=n, duration_s=duration_s)
    if kind == "onoff":
        return onoff(rate, on_s, off_s, rate_off=rate_off, rng=rng, n=n, duration_s=duration_s)
    return diurnal(rate, amplitude, period_s, rng=rng, n=n, duration_s=duration_s)


# ---------------------------------------------------------------- length distributions

@dataclass(frozen=True)
class LengthDist:
    """A parsed length spec; ``sample`` draws int32 values."""

    spec: str
    """The spec string as given, for provenance."""
    kind: str
    """fixed, uniform, lognormal or resample."""
    params: tuple = ()
    """(V,), (LO, HI), (MEAN, SIGMA) or (PATH, COLUMN)."""
    values: np.ndarray | None = field(default=None, repr=False, compare=False)
    """The pool to bootstrap from (resample only)."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.params[0], dtype=np.int32)
        if self.kind == "uniform":
            lo, hi = self.params
            return rng.integers(lo, hi, size=n, endpoint=True).astype(np.int32)
        if self.kind == "lognormal":
            mean, sigma = self.params
            mu = math.log(mean) - sigma**2 / 2  # so that E[X] = mean
            x = np.rint(rng.lognormal(mu, sigma, n))
            return np.clip(x, 1, _I32_MAX).astype(np.int32)
        return self.values[rng.integers(0, self.values.size, size=n)]


def _spec_number(name: str, spec: str, text: str, what: str, *, integer: bool) -> float:
    try:
        v = int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise InputError(f"{name}: {spec!r}: {what} {text!r} is not {kind}") from None
    if not math.isfinite(v):
        raise InputError(f"{name}: {spec!r}: {what} {text!r} must be finite")
    return v


def parse_length(spec: str, column: str = "batch", *, name: str | None = None) -> LengthDist:
    """Parse a length spec for ``column``; ``name`` labels errors (e.g. ``--batch``)."""
    name = name or column
    if column not in LENGTH_COLUMNS:
        raise InputError(f"{name}: unknown length column {column!r}; one of {', '.join(LENGTH_COLUMNS)}")
    low = 1 if column == "batch" else 0
    spec = str(spec).strip()
    kind, _, rest = spec.partition(":")
    usage = ("expected fixed:V, uniform:LO:HI, lognormal:MEAN:SIGMA or resample:PATH[:COLUMN]")
    if kind == "fixed":
        parts = rest.split(":") if rest else []
        if len(parts) != 1:
            raise InputError(f"{name}: {spec!r}: fixed needs one value, as fixed:V")
        v = int(_spec_number(name, spec, parts[0], "V", integer=True))
        if not low <= v <= _I32_MAX:
            raise InputError(f"{name}: {spec!r}: V must be between {low} and {_I32_MAX}")
        return LengthDist(spec, "fixed", (v,))
    if kind == "uniform":
        parts = rest.split(":") if rest else []
        if len(parts) != 2:
            raise InputError(f"{name}: {spec!r}: uniform needs two bounds, as uniform:LO:HI")
        lo, hi = (int(_spec_number(name, spec, p, w, integer=True)) for p, w in zip(parts, ("LO", "HI")))
        if lo < low or hi > _I32_MAX:
            raise InputError(f"{name}: {spec!r}: bounds must be between {low} and {_I32_MAX}")
        if lo > hi:
            raise InputError(f"{name}: {spec!r}: LO {lo} is greater than HI {hi}")
        return LengthDist(spec, "uniform", (lo, hi))
    if kind == "lognormal":
        parts = rest.split(":") if rest else []
        if len(parts) != 2:
            raise InputError(f"{name}: {spec!r}: lognormal needs MEAN and SIGMA, as lognormal:MEAN:SIGMA")
        mean = _spec_number(name, spec, parts[0], "MEAN", integer=False)
        sigma = _spec_number(name, spec, parts[1], "SIGMA", integer=False)
        if mean <= 0:
            raise InputError(f"{name}: {spec!r}: MEAN must be > 0")
        if sigma < 0:
            raise InputError(f"{name}: {spec!r}: SIGMA must be >= 0")
        return LengthDist(spec, "lognormal", (mean, sigma))
    if kind == "resample":
        if not rest:
            raise InputError(f"{name}: {spec!r}: resample needs a trace file, as resample:PATH[:COLUMN]")
        path, col = rest, column
        head, sep, tail = rest.rpartition(":")
        if sep and tail in LENGTH_COLUMNS and head:
            path, col = head, tail

        trace = load_trace(path)
        present = trace.meta.get("columns", list(LENGTH_COLUMNS))
        if col not in present:
            raise InputError(f"{name}: {spec!r}: {path} has no {col} column "
                             f"(it has {', '.join(c for c in present if c in LENGTH_COLUMNS) or 'none'})")
        values = np.ascontiguousarray(getattr(trace, col), dtype=np.int32)
        if values.min() < low:
            raise InputError(f"{name}: {spec!r}: {path} {col} has values below {low}")
        return LengthDist(spec, "resample", (path, col), values)
    raise InputError(f"{name}: {spec!r}: unknown distribution {kind!r}; {usage}")


# ---------------------------------------------------------------------------- traces

def make_trace(arrival_s: np.ndarray, *, rng: np.random.Generator,
               batch: str | LengthDist | None = None, seq_len: str | LengthDist | None = None,
               input_tokens: str | LengthDist | None = None,
               output_tokens: str | LengthDist | None = None,
               source: str = "<generated>", meta: dict | None = None) -> Trace:
    """Attach sampled length columns to arrival times; ``None`` keeps a column's default.

    Each column draws from its own child of ``rng``, so changing one column's spec
    leaves the others' values unchanged (common random numbers across experiments).
    """
    specs = {"batch": batch, "seq_len": seq_len, "input_tokens": input_tokens,
             "output_tokens": output_tokens}
    children = rng.spawn(len(specs))
    n = len(arrival_s)
    cols, meta = {}, dict(meta or {})
    for (col, spec), child in zip(specs.items(), children):
        if spec is None:
            continue
        dist = spec if isinstance(spec, LengthDist) else parse_length(spec, col)
        cols[col] = dist.sample(child, n)
        meta[col] = dist.spec
    return Trace.from_arrivals(arrival_s, source=source, meta=meta, **cols)


def generate(kind: str, *, rng: np.random.Generator, n: int | None = None,
             duration_s: float | None = None, batch=None, seq_len=None, input_tokens=None,
             output_tokens=None, **params) -> Trace:
    """A synthetic trace: ``arrival_times(kind, ...)`` plus ``make_trace`` lengths.

    Arrivals and lengths use separate child generators, so lengths never shift the
    arrival times for a given seed.
    """
    arrivals_rng, lengths_rng = rng.spawn(2)
    arrival = arrival_times(kind, rng=arrivals_rng, n=n, duration_s=duration_s, **params)
    meta = {"generator": kind, **{k: v for k, v in params.items() if v is not None}}
    if n is not None:
        meta["n"] = n
    else:
        meta["duration_s"] = duration_s
    return make_trace(arrival, rng=lengths_rng, batch=batch, seq_len=seq_len,
                      input_tokens=input_tokens, output_tokens=output_tokens, meta=meta)
