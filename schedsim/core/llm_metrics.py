"""Summaries of an LLM run, as `vllm bench serve` and GenAI-Perf define them.

Latency is measured from each request's *scheduled* arrival (``requests.arrival_ns``),
as MLPerf LoadGen does; vLLM's benchmark measures from the actual send. Latency
metrics (TTFT, TPOT, E2E, queue time) are over completed requests, as both tools
report them over successful requests only. Warm-up: requests arriving before
``warmup_s`` count in no request metric, steps starting before it in no step metric.
Every key is always present (NaN where there is no data), so
:func:`schedsim.core.metrics.combine_replications` can average the summaries of replications.
"""

from __future__ import annotations

import numpy as np

from schedsim.core.llm_results import LLMResult
from schedsim.core.results import (COMPLETED, FAILED, QUEUED, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT,
                               REJECTED_TOO_LONG, RUNNING)

LLM_PERCENTILES = {"p50": 50, "p90": 90, "p99": 99}
"""Percentiles of each latency metric (``ttft_p50_ms`` ...), as `vllm bench serve` prints them."""
LATENCIES = ("ttft", "tpot", "itl", "e2e")
REJECTED = (REJECTED_QUEUE_FULL, REJECTED_TIMEOUT, REJECTED_TOO_LONG)
NAN = float("nan")


def weighted_percentile(values: np.ndarray, counts: np.ndarray, q) -> np.ndarray | float:
    """``np.percentile(np.repeat(values, counts), q)`` (the 'linear' method) without the repeat.

    Exact: the two order statistics around each position are found in the cumulative
    counts and interpolated as numpy does. NaN when the counts sum to zero.
    """
    values = np.asarray(values, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    if values.shape != counts.shape or values.ndim != 1:
        raise ValueError(f"values {values.shape} and counts {counts.shape} must be equal-length 1-D arrays")
    if (counts < 0).any():
        raise ValueError("counts must be non-negative")
    q = np.asarray(q, dtype=np.float64)
    if ((q < 0) | (q > 100)).any():
        raise ValueError(f"percentiles must lie in [0, 100], got {q}")
    if values.size > 1:
        # Merge runs of equal neighbours first: a run's repeated decode steps leave long
        # ones (ITL: ~1.2M gaps, ~0.2M runs), so far fewer entries are sorted. The order
        # of equal values never changes the result.
        starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
        values, counts = values[starts], np.add.reduceat(counts, starts)
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(counts[order])
    n = int(cum[-1]) if cum.size else 0
    if n == 0:
        return np.full(q.shape, np.nan)[()]
    pos = (q / 100) * (n - 1)
    lo = np.floor(pos)
    t = pos - lo
    lo = lo.astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    # Element k of the expanded sample is the first value whose cumulative count exceeds k.
    a = values[np.searchsorted(cum, lo, side="right")]
    b = values[np.searchsorted(cum, hi, side="right")]
    diff = b - a
    # numpy's _lerp: from the nearer end, so the result stays within [a, b].
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)[()]


def _describe(out: dict, name: str, values_ms: np.ndarray, counts: np.ndarray | None = None) -> None:
    """``{name}_{p50,p90,p99,mean}_ms``: percentiles and mean, NaN when empty."""
    counts = np.ones(values_ms.shape, np.int64) if counts is None else counts
    n = int(counts.sum())
    qs = weighted_percentile(values_ms, counts, list(LLM_PERCENTILES.values()))
    for (key, _), v in zip(LLM_PERCENTILES.items(), np.atleast_1d(qs)):
        out[f"{name}_{key}_ms"] = float(v)
    out[f"{name}_mean_ms"] = float((values_ms * counts).sum() / n) if n else NAN


def _ratio(num, den) -> float:
    return float(num / den) if den > 0 else NAN


def summarize_llm(result: LLMResult, warmup_s: float = 0.0, slo_ttft_ms: float | None = None,
                  slo_tpot_ms: float | None = None, slo_e2e_ms: float | None = None) -> dict:
    """The numbers an LLM run prints and writes to summary.json (see docs: "Metrics")."""
    req = result.requests
    t0 = int(round(warmup_s * 1e9))
    keep = req.arrival_ns >= t0
    status = result.status[keep]
    done = keep & (result.status == COMPLETED)
    admitted = keep & (result.scheduled_ns >= 0)
    arrival = req.arrival_ns[done]
    tokens = result.tokens_out[done].astype(np.int64)
    ttft_ms = (result.first_token_ns[done] - arrival) / 1e6
    e2e_ms = (result.end_ns[done] - arrival) / 1e6
    multi = tokens > 1  # TPOT is undefined for one output token
    tpot_ms = (e2e_ms[multi] - ttft_ms[multi]) / (tokens[multi] - 1)

    out: dict = {
        "requests": int(keep.sum()),
        "completed": int(done.sum()),
        "rejected": int(np.isin(status, REJECTED).sum()),
        "rejected_too_long": int((status == REJECTED_TOO_LONG).sum()),
        "failed": int((status == FAILED).sum()),
        "unfinished": int(np.isin(status, (QUEUED, RUNNING)).sum()),
    }
    _describe(out, "ttft", ttft_ms)
    _describe(out, "tpot", tpot_ms)
    # The result pools gaps without saying whose they were: the drivers leave out the gaps
    # of requests arriving before the warm-up cut (simulate_llm's itl_from_ns, run_live_llm's warmup_s).
    _describe(out, "itl", result.itl_ns / 1e6, result.itl_count)
    _describe(out, "e2e", e2e_ms)
    queue_ms = (result.scheduled_ns[done] - arrival) / 1e6
    out["mean_queue_ms"] = float(queue_ms.mean()) if done.any() else NAN

    # Duration: first measured arrival to last completion, as schedsim.core.metrics.summarize.
    span_s = (result.end_ns[done].max() - req.arrival_ns[keep].min()) / 1e9 if done.any() else 0.0
    out["duration_s"] = float(span_s) if done.any() else NAN
    out["throughput_rps"] = _ratio(done.sum(), span_s)
    out["output_tokens_per_s"] = _ratio(tokens.sum(), span_s)
    out["total_tokens_per_s"] = _ratio(req.input_tokens[done].astype(np.int64).sum() + tokens.sum(),
                                       span_s)
    # A request is good when it completed and met every SLO given (vacuous when none
    # is given: goodput then equals throughput). TPOT's SLO holds for 1-token outputs.
    good = np.ones(int(done.sum()), dtype=bool)
    if slo_ttft_ms is not None:
        good &= ttft_ms <= slo_ttft_ms
    if slo_e2e_ms is not None:
        good &= e2e_ms <= slo_e2e_ms
    if slo_tpot_ms is not None:
        good[np.flatnonzero(multi)[tpot_ms > slo_tpot_ms]] = False
    out["good"] = int(good.sum())
    out["goodput_rps"] = _ratio(good.sum(), span_s)
    out["slo_attainment"] = _ratio(good.sum(), keep.sum())

    out["preemptions"] = int(result.preemptions[keep].astype(np.int64).sum())
    hits = result.prefix_hit_tokens[admitted].astype(np.int64).sum()
    out["prefix_hit_rate"] = _ratio(hits, req.input_tokens[admitted].astype(np.int64).sum())

    steps = result.step_start_ns >= t0
    repeats = result.step_repeats[steps].astype(np.int64)
    seqs = result.step_seqs[steps].astype(np.int64)
    busy_ns = (result.step_end_ns[steps] - result.step_start_ns[steps]).astype(np.float64)
    n_steps = int(repeats.sum())
    out["steps"] = n_steps
    out["mean_step_ms"] = _ratio(busy_ns.sum() / 1e6, n_steps)
    out["mean_batch_tokens"] = _ratio((result.step_tokens[steps].astype(np.int64) * repeats).sum(),
                                      n_steps)
    out["max_running"] = int(seqs.max()) if seqs.size else NAN
    out["mean_running"] = _ratio((seqs * busy_ns).sum(), busy_ns.sum())
    kv = result.step_kv_blocks[steps]
    out["max_kv_blocks"] = int(kv.max()) if kv.size else NAN
    out["kv_blocks_total"] = int(result.kv_blocks_total)
    out["peak_kv_utilization"] = _ratio(out["max_kv_blocks"], result.kv_blocks_total)  # NaN unpaged
    return out
