"""Summaries of a run, as vector expressions over the per-request table."""

from __future__ import annotations

import numpy as np

from schedsim.core.results import (COMPLETED, FAILED, QUEUED, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT,
                               RUNNING, SimResult)

PERCENTILES = {"p50_ms": 50, "p90_ms": 90, "p95_ms": 95, "p99_ms": 99, "p999_ms": 99.9}
"""Latency percentiles reported everywhere (keys of summary.json)."""


def measured_rows(result: SimResult, warmup_s: float = 0.0) -> np.ndarray:
    """Boolean mask of requests that count: those arriving at or after ``warmup_s``."""
    return result.requests.arrival_ns >= int(round(warmup_s * 1e9))


def summarize(result: SimResult, warmup_s: float = 0.0) -> dict:
    """The numbers ``schedsim run`` prints and writes to summary.json."""
    req = result.requests
    keep = measured_rows(result, warmup_s)
    everything = bool(keep.all())
    status = result.status if everything else result.status[keep]
    done = result.status == COMPLETED
    if not everything:
        done &= keep
    n_done = int(np.count_nonzero(done))
    # In the common case every request completed: use the columns as they are, no copies.
    pick = (lambda col: col) if n_done == len(done) else (lambda col: col[done])
    count = {code: int(np.count_nonzero(status == code)) for code in
             (QUEUED, RUNNING, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT, FAILED)}
    out: dict = {
        "requests": int(np.count_nonzero(keep)),
        "completed": n_done,
        "rejected": count[REJECTED_QUEUE_FULL] + count[REJECTED_TIMEOUT],
        "rejected_queue_full": count[REJECTED_QUEUE_FULL],
        "rejected_timeout": count[REJECTED_TIMEOUT],
        "failed": count[FAILED],
        "unfinished": count[QUEUED] + count[RUNNING],
    }
    if n_done:
        arrival_ns, end_ns = pick(req.arrival_ns), pick(result.end_ns)
        first = req.arrival_ns.min() if everything else req.arrival_ns[keep].min()
        span_s = (end_ns.max() - first) / 1e9
        out["throughput_rps"] = float(n_done / span_s) if span_s > 0 else float("nan")
        out["samples_per_s"] = float(pick(req.samples).sum() / span_s) if span_s > 0 else float("nan")
        latency_ms = _ms(end_ns - arrival_ns)
        mean_ms, max_ms = float(latency_ms.mean()), float(latency_ms.max())
        # One partial sort for all percentiles, in place: latency_ms is ours and its mean is taken.
        for key, value in zip(PERCENTILES, percentiles_in_place(latency_ms)):
            out[key] = value
        del latency_ms
        out["mean_ms"] = mean_ms
        out["max_ms"] = max_ms
        out["mean_queue_ms"] = float(_ms(pick(result.start_ns) - arrival_ns).mean())
    else:
        for key in ("throughput_rps", "samples_per_s", *PERCENTILES, "mean_ms", "max_ms",
                    "mean_queue_ms"):
            out[key] = float("nan")
    out["offered_rps"] = offered_rate(req.arrival_ns if everything else req.arrival_ns[keep])
    batches = result.batch_start_ns >= int(round(warmup_s * 1e9))
    sizes = result.batch_samples[batches]
    out["batches"] = int(batches.sum())
    # Triton's nv_inference_count / nv_inference_exec_count: samples per execution.
    out["mean_batch_size"] = float(sizes.mean()) if sizes.size else float("nan")
    values, counts = np.unique(sizes, return_counts=True)
    out["batch_size_histogram"] = {int(v): int(c) for v, c in zip(values, counts)}
    out["utilization"] = instance_utilization(result, warmup_s)
    return out


_QUANTILES = np.true_divide(list(PERCENTILES.values()), 100)


def percentiles_in_place(values: np.ndarray) -> list[float]:
    """``np.percentile(values, PERCENTILES, overwrite_input=True).tolist()`` (numpy's default
    "linear" method, the same floats) for finite ``values``, one or more, partially sorted in
    place. numpy's own picks its partition points with np.unique, which loads numpy.ma: about
    7-12 ms of CPU in every run's start-up."""
    n = values.size
    virtual = (n - 1) * _QUANTILES
    below = np.floor(virtual)
    above = below + 1
    last = virtual >= n - 1
    below[last] = n - 1
    above[last] = n - 1
    below, above = below.astype(np.intp), above.astype(np.intp)
    values.partition(sorted({0, n - 1, *below.tolist(), *above.tolist()}))
    lo, hi = values[below], values[above]
    # numpy's _lerp: from the nearer end, so that gamma 1 gives hi exactly.
    gamma = virtual - np.where(last, -1, below)
    diff = hi - lo
    result = lo + diff * gamma
    np.subtract(hi, diff * (1 - gamma), out=result, where=gamma >= 0.5)
    return result.tolist()


def offered_rate(arrival_ns: np.ndarray) -> float:
    """Requests per second the trace offers: arrivals over their span (NaN for fewer than two)."""
    if arrival_ns.size < 2:
        return float("nan")
    span_ns = int(arrival_ns.max()) - int(arrival_ns.min())
    # n arrivals span n - 1 gaps.
    return float((arrival_ns.size - 1) / (span_ns / 1e9)) if span_ns > 0 else float("nan")


OVERLOAD_SHORTFALL = 0.95
"""Throughput below this fraction of the offered rate means the system fell behind."""


def overload(summary: dict, result: SimResult, warmup_s: float = 0.0) -> str | None:
    """A warning when the system could not keep up with the trace: throughput below
    :data:`OVERLOAD_SHORTFALL` of the offered rate, with how the queue delay grew from the
    first fifth of the measured requests to the last; None when it kept up."""
    if not overloaded(summary):
        return None
    req = result.requests
    keep = np.flatnonzero(measured_rows(result, warmup_s) & (result.start_ns >= 0))
    grew = ""
    if keep.size >= 10:
        fifth = keep.size // 5
        queue_ms = (result.start_ns[keep] - req.arrival_ns[keep]) / 1e6
        grew = (f"; the queue grew through the trace (mean queue delay {queue_ms[:fifth].mean():,.3g} ms "
                f"in the first fifth of requests, {queue_ms[-fifth:].mean():,.3g} ms in the last)")
    return overload_warning(summary, grew)


def overloaded(summary: dict) -> bool:
    """Whether ``summary``'s throughput is below :data:`OVERLOAD_SHORTFALL` of its offered rate."""
    offered, achieved = summary.get("offered_rps"), summary.get("throughput_rps")
    if offered is None or achieved is None or not (np.isfinite(offered) and np.isfinite(achieved)):
        return False
    return achieved < OVERLOAD_SHORTFALL * offered


def overload_warning(summary: dict, detail: str = "") -> str:
    """The overload warning's words for ``summary``; ``detail`` (``"; ..."``) says more."""
    return (f"overloaded: throughput {summary['throughput_rps']:,.1f} req/s is below the offered "
            f"{summary['offered_rps']:,.1f} req/s{detail}; latencies grow with the trace's length "
            "and say nothing about a steady state")


def _ms(ns: np.ndarray) -> np.ndarray:
    """``ns / 1e6``, written over ``ns`` (a fresh int64 array of the same size): the same
    numbers without a second 2M-row array."""
    if ns.dtype != np.int64:
        return ns / 1e6
    return np.divide(ns, 1e6, out=ns.view(np.float64))


def instance_utilization(result: SimResult, warmup_s: float = 0.0) -> list[float]:
    """Busy fraction of each instance between warm-up end and the last completion."""
    t0 = int(round(warmup_s * 1e9))
    t1 = result.batch_end_ns.max() if result.batch_end_ns.size else t0
    if t1 <= t0:
        return [0.0] * result.instances
    busy = np.clip(result.batch_end_ns, t0, t1) - np.clip(result.batch_start_ns, t0, t1)
    per = np.bincount(result.batch_instance, weights=busy, minlength=result.instances)
    return [float(b / (t1 - t0)) for b in per]


def queue_length(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    """Requests waiting (arrived, not started) over time, as a step function (t_s, length)."""
    req = result.requests
    started = result.start_ns >= 0
    left_ns = np.where(started, result.start_ns, result.end_ns)  # rejected leave at rejection
    left_ns = left_ns[left_ns >= 0]
    t = np.concatenate([req.arrival_ns, left_ns])
    step = np.concatenate([np.ones(len(req), np.int64), -np.ones(len(left_ns), np.int64)])
    order = np.lexsort((-step, t))  # at one instant count departures first
    return t[order] / 1e9, np.cumsum(step[order])


def combine_replications(summaries: list[dict], confidence: float = 0.95) -> dict:
    """Mean of each scalar metric over replications, with a Student-t confidence interval."""
    from scipy import stats  # only here: importing scipy costs more than a small run

    out: dict = {"replications": len(summaries)}
    keys = [k for k, v in summaries[0].items() if isinstance(v, (int, float))]
    for key in keys:
        values = np.array([s[key] for s in summaries], dtype=float)
        mean = float(values.mean())
        out[key] = mean
        if len(values) > 1 and np.isfinite(values).all():
            half = float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)
                         * values.std(ddof=1) / np.sqrt(len(values)))
            out[f"{key}_ci"] = [mean - half, mean + half]
    return out
