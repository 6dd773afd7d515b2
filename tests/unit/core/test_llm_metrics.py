"""LLM metrics against hand-computed values on a hand-built LLMResult (no simulator)."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.csv as pacsv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedsim.core.llm_metrics import summarize_llm, weighted_percentile
from schedsim.run.llm_plots import step_series
from schedsim.run.llm_report import write_llm_outputs
from schedsim.core.llm_results import LLMResult
from schedsim.core.metrics import combine_replications
from schedsim.core.policy import Requests
from schedsim.core.results import COMPLETED, QUEUED, REJECTED_TOO_LONG, RUNNING

MS = 1_000_000


def make_result(**over) -> LLMResult:
    """Five requests (times in ms):

    row  arrival sched first end  out  prompt  hits preempt  status
    0    0       1     10    50   5    100     50   1        completed: TTFT 10, E2E 50, TPOT 10
    1    5       5     25    25   1    200     0    0        completed: TTFT 20, E2E 20, no TPOT
    2    10      12    40    100  4    50      25   0        completed: TTFT 30, E2E 90, TPOT 20
    3    20      -     -     20   0    5000    0    0        rejected: too long
    4    30      60    80    -    2/10 10      0    1        running at the end
    """
    n = 5
    req = Requests(
        arrival_ns=np.array([0, 5, 10, 20, 30], np.int64) * MS,
        samples=np.ones(n, np.int32), seq_len=np.zeros(n, np.int32),
        priority=np.zeros(n, np.int16), timeout_ns=np.zeros(n, np.int64),
        input_tokens=np.array([100, 200, 50, 5000, 10], np.int32),
        output_tokens=np.array([5, 1, 4, 8, 10], np.int32))
    cols = dict(
        requests=req,
        status=np.array([COMPLETED, COMPLETED, COMPLETED, REJECTED_TOO_LONG, RUNNING], np.int8),
        scheduled_ns=np.array([1 * MS, 5 * MS, 12 * MS, -1, 60 * MS], np.int64),
        first_token_ns=np.array([10 * MS, 25 * MS, 40 * MS, -1, 80 * MS], np.int64),
        end_ns=np.array([50 * MS, 25 * MS, 100 * MS, 20 * MS, -1], np.int64),
        tokens_out=np.array([5, 1, 4, 0, 2], np.int32),
        preemptions=np.array([1, 0, 0, 0, 1], np.int32),
        prefix_hit_tokens=np.array([50, 0, 25, 0, 0], np.int32),
        # Pooled gaps: 10 ms x4, 15 ms x2, 20 ms x1 (expanded: 10 10 10 10 15 15 20).
        itl_ns=np.array([20, 10, 15], np.int64) * MS,
        itl_count=np.array([1, 4, 2], np.int64),
        # Steps (ms): [1, 10) prefill; [12, 40) mixed; [40, 100) four decode steps.
        step_start_ns=np.array([1, 12, 40], np.int64) * MS,
        step_end_ns=np.array([10, 40, 100], np.int64) * MS,
        step_repeats=np.array([1, 1, 4], np.int32),
        step_seqs=np.array([1, 2, 3], np.int32),
        step_tokens=np.array([100, 60, 3], np.int32),
        step_prefill_tokens=np.array([100, 58, 0], np.int32),
        step_kv_blocks=np.array([7, 10, 12], np.int32),
        step_waiting=np.array([1, 0, 0], np.int32),
        step_preempted=np.array([0, 0, 1], np.int32),
        kv_blocks_total=16,
    )
    cols.update(over)
    return LLMResult(**cols)


def test_hand_computed_summary():
    s = summarize_llm(make_result())
    assert (s["requests"], s["completed"], s["rejected"], s["rejected_too_long"], s["failed"],
            s["unfinished"]) == (5, 3, 1, 1, 0, 1)
    # TTFT 10, 20, 30: p90 at position 1.8 -> 20 + 0.8 * 10.
    assert s["ttft_p50_ms"] == pytest.approx(20)
    assert s["ttft_p90_ms"] == pytest.approx(28)
    assert s["ttft_p99_ms"] == pytest.approx(29.8)
    assert s["ttft_mean_ms"] == pytest.approx(20)
    # E2E sorted 20, 50, 90.
    assert s["e2e_p50_ms"] == pytest.approx(50)
    assert s["e2e_p90_ms"] == pytest.approx(82)
    assert s["e2e_p99_ms"] == pytest.approx(89.2)
    assert s["e2e_mean_ms"] == pytest.approx(160 / 3)
    # TPOT: (50-10)/4 = 10 and (90-30)/3 = 20; row 1 (one token) has none.
    assert s["tpot_p50_ms"] == pytest.approx(15)
    assert s["tpot_p90_ms"] == pytest.approx(19)
    assert s["tpot_p99_ms"] == pytest.approx(19.9)
    assert s["tpot_mean_ms"] == pytest.approx(15)
    # ITL over 10 10 10 10 15 15 20: p90 at position 5.4 -> 15 + 0.4 * 5.
    assert s["itl_p50_ms"] == pytest.approx(10)
    assert s["itl_p90_ms"] == pytest.approx(17)
    assert s["itl_p99_ms"] == pytest.approx(19.7)
    assert s["itl_mean_ms"] == pytest.approx(90 / 7)
    assert s["mean_queue_ms"] == pytest.approx(1)  # (1 + 0 + 2) / 3
    # Duration: first arrival (0) to last completion (100 ms).
    assert s["duration_s"] == pytest.approx(0.1)
    assert s["throughput_rps"] == pytest.approx(30)
    assert s["output_tokens_per_s"] == pytest.approx(100)  # (5 + 1 + 4) / 0.1
    assert s["total_tokens_per_s"] == pytest.approx(3600)  # (350 + 10) / 0.1
    # No SLO given: every completed request is good.
    assert s["goodput_rps"] == pytest.approx(s["throughput_rps"])
    assert s["slo_attainment"] == pytest.approx(3 / 5)
    assert s["preemptions"] == 2
    # Admitted rows 0, 1, 2, 4: (50 + 25) / (100 + 200 + 50 + 10).
    assert s["prefix_hit_rate"] == pytest.approx(75 / 360)
    assert s["steps"] == 6
    assert s["mean_step_ms"] == pytest.approx(97 / 6)  # (9 + 28 + 60) ms over 6 steps
    assert s["mean_batch_tokens"] == pytest.approx((100 + 60 + 3 * 4) / 6)
    assert s["max_running"] == 3
    assert s["mean_running"] == pytest.approx((1 * 9 + 2 * 28 + 3 * 60) / 97)
    assert (s["max_kv_blocks"], s["kv_blocks_total"]) == (12, 16)
    assert s["peak_kv_utilization"] == pytest.approx(0.75)


def test_slos():
    # TTFT 25 ms: row 2 (30 ms) misses; 2 good requests over 0.1 s, of 5 measured.
    s = summarize_llm(make_result(), slo_ttft_ms=25)
    assert s["good"] == 2
    assert s["goodput_rps"] == pytest.approx(20)
    assert s["slo_attainment"] == pytest.approx(0.4)
    # TPOT 15 ms: row 2 (20 ms) misses; row 1 has one token, so no TPOT to miss.
    s = summarize_llm(make_result(), slo_tpot_ms=15)
    assert s["good"] == 2
    # E2E 60 ms and TTFT 15 ms: row 2 misses E2E, row 1 misses TTFT; only row 0 meets both.
    s = summarize_llm(make_result(), slo_ttft_ms=15, slo_e2e_ms=60)
    assert s["good"] == 1
    assert s["goodput_rps"] == pytest.approx(10)
    # Limits are inclusive.
    assert summarize_llm(make_result(), slo_ttft_ms=30, slo_tpot_ms=20, slo_e2e_ms=90)["good"] == 3


def test_warmup_excludes_early_requests_and_steps():
    # Warm-up 8 ms: rows 0 and 1 and the first step (at 1 ms) do not count.
    s = summarize_llm(make_result(), warmup_s=0.008)
    assert (s["requests"], s["completed"], s["rejected"], s["unfinished"]) == (3, 1, 1, 1)
    assert s["ttft_p50_ms"] == pytest.approx(30)
    assert s["tpot_mean_ms"] == pytest.approx(20)
    assert s["e2e_p99_ms"] == pytest.approx(90)
    assert s["mean_queue_ms"] == pytest.approx(2)
    assert s["duration_s"] == pytest.approx(0.09)  # 10 ms to 100 ms
    assert s["throughput_rps"] == pytest.approx(1 / 0.09)
    assert s["output_tokens_per_s"] == pytest.approx(4 / 0.09)
    assert s["preemptions"] == 1
    assert s["prefix_hit_rate"] == pytest.approx(25 / 60)
    assert s["steps"] == 5
    assert s["mean_running"] == pytest.approx((2 * 28 + 3 * 60) / 88)
    assert s["max_kv_blocks"] == 12


def test_one_token_outputs_have_no_tpot():
    r = make_result(tokens_out=np.array([1, 1, 1, 0, 2], np.int32))
    s = summarize_llm(r)
    assert math.isnan(s["tpot_p50_ms"]) and math.isnan(s["tpot_mean_ms"])
    assert s["ttft_p50_ms"] == pytest.approx(20)
    assert s["output_tokens_per_s"] == pytest.approx(30)


def test_no_data_is_nan_and_keys_are_stable():
    full = summarize_llm(make_result())
    empty = summarize_llm(make_result(), warmup_s=1.0)  # nothing arrives after 1 s
    assert empty.keys() == full.keys()
    assert empty["requests"] == 0 and empty["steps"] == 0
    for key in ("ttft_p50_ms", "tpot_p99_ms", "e2e_mean_ms", "throughput_rps",
                "goodput_rps", "slo_attainment", "prefix_hit_rate", "mean_step_ms",
                "max_running", "peak_kv_utilization", "mean_queue_ms"):
        assert math.isnan(empty[key]), key
    # ITL gaps are pooled without their requests, so warm-up cannot remove them.
    assert empty["itl_p50_ms"] == full["itl_p50_ms"]
    unpaged = summarize_llm(make_result(kv_blocks_total=0))
    assert math.isnan(unpaged["peak_kv_utilization"])


def test_combine_replications_takes_llm_summaries():
    a = summarize_llm(make_result())
    b = summarize_llm(make_result(end_ns=np.array([50, 25, 200, 20, -1], np.int64) * MS))
    c = combine_replications([a, b])
    assert c["replications"] == 2
    assert c["e2e_mean_ms"] == pytest.approx((a["e2e_mean_ms"] + b["e2e_mean_ms"]) / 2)
    lo, hi = c["e2e_mean_ms_ci"]
    assert lo < c["e2e_mean_ms"] < hi
    assert set(a) - {"replications"} <= set(c)


def test_weighted_percentile_hand_values():
    assert weighted_percentile(np.array([3.0]), np.array([5]), 50) == 3.0
    assert weighted_percentile(np.array([1, 2]), np.array([0, 3]), [0, 100]).tolist() == [2, 2]
    assert math.isnan(weighted_percentile(np.array([1, 2]), np.array([0, 0]), 50))
    assert math.isnan(weighted_percentile(np.empty(0), np.empty(0, np.int64), 50))
    with pytest.raises(ValueError, match="counts"):
        weighted_percentile(np.array([1.0]), np.array([-1]), 50)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-10**12, 10**12), st.integers(0, 50)), min_size=1, max_size=30)
       .filter(lambda rows: sum(c for _, c in rows) > 0),
       st.lists(st.floats(0, 100), min_size=1, max_size=5))
def test_weighted_percentile_matches_expanded_numpy(rows, qs):
    values = np.array([v for v, _ in rows], np.int64)
    counts = np.array([c for _, c in rows], np.int64)
    expected = np.percentile(np.repeat(values, counts), qs)
    np.testing.assert_array_equal(weighted_percentile(values, counts, qs), expected)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 40), st.integers(0, 1)),
                min_size=1, max_size=20))
def test_step_series_matches_records(records):
    # Build back-to-back or gapped records; the series must give each record's value
    # on [start, end) and the idle value in the gaps.
    start, end, values, t = [], [], [], 0
    for gap, length, v in records:
        t += gap
        start.append(t)
        end.append(t + length)
        values.append(v + 1)
        t += length
    start, end = np.array(start), np.array(end)
    ts, vs = step_series(start, end, np.array(values), idle=0.0)
    assert (np.diff(ts) >= 0).all()
    for s0, e0, v in zip(start, end, values):
        for probe in (s0, (s0 + e0) / 2):
            assert vs[np.searchsorted(ts, probe / 1e9, side="right") - 1] == v
    assert vs[-1] == 0 and ts[-1] == end[-1] / 1e9


def test_write_llm_outputs(tmp_path):
    result = make_result()
    summary = summarize_llm(result)
    ids = np.array([f"r{i}" for i in range(5)])
    written = write_llm_outputs(tmp_path / "out", result, ids, summary, plot=True)
    names = [p.name for p in written]
    assert names[-1] == "summary.json"
    assert {"requests.csv", "steps.csv", "timeline.png", "latency_cdf.png"} <= set(names)
    assert all(p.stat().st_size > 0 for p in written)
    assert not list((tmp_path / "out").glob(".*.tmp"))
    back = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert back["completed"] == 3 and back["ttft_p50_ms"] == pytest.approx(20)

    req = pacsv.read_csv(tmp_path / "out" / "requests.csv").to_pydict()
    assert list(req) == ["request_id", "arrival_s", "scheduled_s", "first_token_s", "end_s",
                         "ttft_ms", "tpot_ms", "e2e_ms", "input_tokens", "output_tokens",
                         "tokens_out", "preemptions", "prefix_hit_tokens", "status"]
    assert req["status"] == ["completed", "completed", "completed", "rejected_too_long", "running"]
    assert req["ttft_ms"][:3] == [10, 20, 30]
    assert req["ttft_ms"][3] is None and req["ttft_ms"][4] == 50  # running, first token at 80 ms
    assert req["tpot_ms"] == [10, None, 20, None, None]
    assert req["e2e_ms"] == [50, 20, 90, None, None]
    assert req["end_s"][3] == 0.02  # the rejection
    assert req["scheduled_s"][3] is None and req["prefix_hit_tokens"][3] is None

    steps = pacsv.read_csv(tmp_path / "out" / "steps.csv").to_pydict()
    assert list(steps) == ["start_s", "end_s", "repeats", "seqs", "tokens", "prefill_tokens",
                           "kv_blocks", "waiting", "preempted"]
    assert steps["repeats"] == [1, 1, 4] and steps["end_s"] == [0.01, 0.04, 0.1]


def test_failed_plot_leaves_no_summary(tmp_path, monkeypatch):
    import schedsim.run.llm_plots

    out = tmp_path / "out"
    result = make_result()
    write_llm_outputs(out, result, np.arange(5), summarize_llm(result))
    assert (out / "summary.json").exists()  # from an earlier run: must not vouch for this one

    def broken(*args, **kwargs):
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(schedsim.run.llm_plots, "write_llm_plots", broken)
    with pytest.raises(RuntimeError, match="plotting failed"):
        write_llm_outputs(out, result, np.arange(5), summarize_llm(result), plot=True)
    assert not (out / "summary.json").exists()
    assert not list(out.glob(".*.tmp"))


def test_interrupted_csv_write_leaves_nothing_half_written(tmp_path, monkeypatch):
    calls, real_write = [], pacsv.write_csv

    def write_then_fail(table, tmp):
        calls.append(tmp)
        tmp.write_text("half")
        if len(calls) == 2:  # steps.csv
            raise OSError("disk full")
        real_write(table, tmp)

    monkeypatch.setattr(pacsv, "write_csv", write_then_fail)   # what schedsim.run.report writes with
    result = make_result()
    with pytest.raises(OSError):
        write_llm_outputs(tmp_path, result, np.arange(5), summarize_llm(result))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.csv"]


def test_statuses_counted_once():
    status = np.array([COMPLETED, QUEUED, RUNNING, REJECTED_TOO_LONG, COMPLETED], np.int8)
    s = summarize_llm(make_result(status=status, end_ns=np.array([50, -1, -1, 20, 90], np.int64) * MS))
    assert s["completed"] + s["rejected"] + s["failed"] + s["unfinished"] == s["requests"]
