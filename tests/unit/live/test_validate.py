"""schedsim validate: the comparison's math and its refusals of mismatched inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import ks_2samp

from golden import FixedCost
from policies import DynamicBatcher
from schedsim.errors import InputError
from schedsim.core.metrics import summarize
from schedsim.core.policy import Requests
from schedsim.run.report import write_outputs
from schedsim.core.simulate import simulate
from schedsim.traces.table import Trace
from schedsim.live.validate import arrival_hash, err_pct, validate_dirs


def _run_dir(path, arrivals_s, service_ms, *, params=None, summary_extra=None, warmup_s=0.0):
    params = params or {"max_batch_size": 8, "max_queue_delay_us": 500}
    trace = Trace.from_arrivals(arrivals_s)
    req = Requests.from_trace(trace)
    result = simulate(req, DynamicBatcher(**params), FixedCost(service_ms))
    summary = summarize(result, warmup_s)
    summary["config"] = {"policy": "dynamic", "params": params, "instances": 1, "warmup_s": warmup_s}
    summary.update(summary_extra or {})
    write_outputs(path, result, trace.request_id, summary)
    return summary, result


@pytest.fixture
def arrivals():
    return np.cumsum(np.random.default_rng(0).exponential(1 / 400, 3000))


def test_errors_are_signed_percent_of_the_measurement():
    assert err_pct(110.0, 100.0) == pytest.approx(10.0)
    assert err_pct(90.0, 100.0) == pytest.approx(-10.0)
    assert np.isnan(err_pct(1.0, 0.0)) and np.isnan(err_pct(None, 1.0)) and np.isnan(err_pct(float("nan"), 1.0))


def test_predicted_vs_measured_numbers_and_ks(tmp_path, arrivals):
    sim, sim_res = _run_dir(tmp_path / "sim", arrivals, lambda b: 1.0 + 0.1 * b)
    live, live_res = _run_dir(tmp_path / "live", arrivals, lambda b: 1.1 + 0.11 * b)  # "measured" 10% slower
    report = validate_dirs(tmp_path / "sim", tmp_path / "live", plot=True)
    for key, skey in (("p50", "p50_ms"), ("p99", "p99_ms"), ("p999", "p999_ms"), ("mean", "mean_ms"),
                      ("throughput", "throughput_rps"), ("mean_batch_size", "mean_batch_size")):
        assert report[f"{key}_err_pct"] == pytest.approx((sim[skey] - live[skey]) / live[skey] * 100)
    assert report["p50_err_pct"] < -5  # the prediction is faster than the "measurement"
    lat = lambda r: (r.end_ns - r.requests.arrival_ns) / 1e6  # noqa: E731
    assert report["ks_stat"] == pytest.approx(ks_2samp(lat(sim_res), lat(live_res)).statistic)
    written = json.loads((tmp_path / "live" / "validation.json").read_text())
    for key in ("p50_err_pct", "p99_err_pct", "mean_err_pct", "throughput_err_pct", "ks_stat"):
        assert key in written
    assert (tmp_path / "live" / "latency_cdf_validation.png").stat().st_size > 1000
    assert written["arrivals_sha256"] == arrival_hash(arrivals)


def test_identical_runs_agree_exactly(tmp_path, arrivals):
    _run_dir(tmp_path / "a", arrivals, lambda b: 1.0)
    _run_dir(tmp_path / "b", arrivals, lambda b: 1.0)
    report = validate_dirs(tmp_path / "a", tmp_path / "b", out=tmp_path / "v")
    assert report["p99_err_pct"] == 0 and report["ks_stat"] == 0
    assert (tmp_path / "v" / "validation.json").is_file()


def test_confidence_intervals_from_replications(tmp_path, arrivals):
    _run_dir(tmp_path / "sim", arrivals, lambda b: 1.0, summary_extra={"replications": 5, "p99_ms_ci": [0.0, 1e9]})
    _run_dir(tmp_path / "live", arrivals, lambda b: 1.05)
    report = validate_dirs(tmp_path / "sim", tmp_path / "live")
    assert report["metrics"]["p99"]["predicted_ci"] == [0.0, 1e9]
    assert report["metrics"]["p99"]["measured_in_ci"] is True and report["replications"] == 5


def test_warmup_is_excluded_from_the_ks_test(tmp_path, arrivals):
    _run_dir(tmp_path / "a", arrivals, lambda b: 1.0, warmup_s=2.0)
    _run_dir(tmp_path / "b", arrivals, lambda b: 1.0, warmup_s=2.0)
    report = validate_dirs(tmp_path / "a", tmp_path / "b")
    assert report["completed"]["measured"] == int((arrivals >= 2.0).sum())


@pytest.mark.parametrize("case,needle", [
    ("missing", "no such directory"),
    ("no-summary", "no summary.json"),
    ("other-trace", "different traces"),
    ("other-params", "differ in params"),
    ("partial", "partial"),
    ("other-warmup", "differ in warmup_s"),
])
def test_mismatched_inputs_are_refused(tmp_path, arrivals, case, needle):
    _run_dir(tmp_path / "sim", arrivals, lambda b: 1.0)
    live = tmp_path / "live"
    if case == "missing":
        live = tmp_path / "nowhere"
    elif case == "no-summary":
        _run_dir(live, arrivals, lambda b: 1.0)
        (live / "summary.json").unlink()
    elif case == "other-trace":
        _run_dir(live, arrivals[:-1], lambda b: 1.0)
    elif case == "other-params":
        _run_dir(live, arrivals, lambda b: 1.0, params={"max_batch_size": 4, "max_queue_delay_us": 500})
    elif case == "partial":
        _run_dir(live, arrivals, lambda b: 1.0, summary_extra={"partial": True, "partial_reason": "time limit"})
    elif case == "other-warmup":
        _run_dir(live, arrivals, lambda b: 1.0, warmup_s=1.0)
    with pytest.raises(InputError, match=needle):
        validate_dirs(tmp_path / "sim", live)


def test_several_live_runs_are_one_measurement_their_median(tmp_path, arrivals):
    sim, sim_res = _run_dir(tmp_path / "sim", arrivals, lambda b: 1.0 + 0.1 * b)
    lives = []
    for i, slower in enumerate((0.95, 1.02, 1.20)):   # three "runs" of the same trace
        s, r = _run_dir(tmp_path / f"live{i}", arrivals, lambda b, k=slower: k * (1.0 + 0.1 * b))
        lives.append((s, r))
    report = validate_dirs(tmp_path / "sim", [tmp_path / f"live{i}" for i in range(3)], out=tmp_path / "v")
    p99s = [s["p99_ms"] for s, _ in lives]
    row = report["metrics"]["p99"]
    assert row["measured"] == pytest.approx(np.median(p99s)) and row["measured_runs"] == p99s
    assert report["p99_err_pct"] == pytest.approx(err_pct(sim["p99_ms"], np.median(p99s)))
    assert row["measured_range"] == [min(p99s), max(p99s)]
    assert row["predicted_in_measured_range"] is (min(p99s) <= sim["p99_ms"] <= max(p99s))
    lat = lambda r: (r.end_ns - r.requests.arrival_ns) / 1e6  # noqa: E731
    pooled = np.concatenate([lat(r) for _, r in lives])
    assert report["ks_stat"] == pytest.approx(ks_2samp(lat(sim_res), pooled).statistic)
    assert report["live_runs"] == 3 and len(report["live_dirs"]) == 3
    assert json.loads((tmp_path / "v" / "validation.json").read_text())["live_runs"] == 3


def test_one_live_run_in_a_list_is_the_single_run_report(tmp_path, arrivals):
    _run_dir(tmp_path / "sim", arrivals, lambda b: 1.0)
    _run_dir(tmp_path / "live", arrivals, lambda b: 1.05)
    one = validate_dirs(tmp_path / "sim", tmp_path / "live", out=tmp_path / "a")
    listed = validate_dirs(tmp_path / "sim", [tmp_path / "live"], out=tmp_path / "b")
    assert {k: v for k, v in one.items() if k != "written"} == {k: v for k, v in listed.items() if k != "written"}
    assert "live_runs" not in listed


def test_a_mismatched_run_among_several_is_refused_by_name(tmp_path, arrivals):
    _run_dir(tmp_path / "sim", arrivals, lambda b: 1.0)
    _run_dir(tmp_path / "live0", arrivals, lambda b: 1.0)
    _run_dir(tmp_path / "live1", arrivals[:-1], lambda b: 1.0)
    with pytest.raises(InputError, match="live1.*different traces"):
        validate_dirs(tmp_path / "sim", [tmp_path / "live0", tmp_path / "live1"])


def test_band_coverage_of_several_live_runs_and_its_width_against_their_spread(tmp_path, arrivals):
    """A prediction with a band (p99_ms_lo/hi in its summary): each live run in or out of it,
    its coverage, its half-width and the live runs' own spread in percent of their median."""
    _run_dir(tmp_path / "live-probe", arrivals, lambda b: 1.0 + 0.1 * b)
    probe = json.loads((tmp_path / "live-probe" / "summary.json").read_text())
    p99 = probe["p99_ms"]
    band = {"p99_ms_lo": 0.97 * p99, "p99_ms_hi": 1.10 * p99, "band": {"level": 0.9}}
    _run_dir(tmp_path / "sim", arrivals, lambda b: 1.0 + 0.1 * b, summary_extra=band)
    lives = []
    for i, slower in enumerate((0.95, 1.02, 1.20)):
        s, _ = _run_dir(tmp_path / f"live{i}", arrivals, lambda b, k=slower: k * (1.0 + 0.1 * b))
        lives.append(s["p99_ms"])
    report = validate_dirs(tmp_path / "sim", [tmp_path / f"live{i}" for i in range(3)], out=tmp_path / "v")
    row = report["metrics"]["p99"]
    lo, hi = band["p99_ms_lo"], band["p99_ms_hi"]
    assert row["predicted_band"] == [lo, hi] and row["band_level"] == 0.9
    assert row["runs_in_band"] == [lo <= v <= hi for v in lives]
    assert row["band_coverage"] == pytest.approx(np.mean([lo <= v <= hi for v in lives]))
    m = float(np.median(lives))
    assert row["measured_in_band"] is (lo <= m <= hi)
    assert row["band_half_width_pct"] == pytest.approx((hi - lo) / 2 / m * 100)
    assert row["live_spread_pct"] == pytest.approx(1.6449 * np.std(lives, ddof=1) / m * 100)
    assert row["band_to_live_spread"] == pytest.approx(row["band_half_width_pct"] / row["live_spread_pct"])
    assert report["band"]["runs_covered"] == pytest.approx(row["band_coverage"])  # the only metric with a band
    assert report["metrics"]["p50"].get("predicted_band") is None
    assert report["p99_err_pct"] == pytest.approx(err_pct(row["predicted"], m))   # the existing outputs stay
    one = validate_dirs(tmp_path / "sim", tmp_path / "live0", out=tmp_path / "w")
    assert one["metrics"]["p99"]["measured_in_band"] is (lo <= lives[0] <= hi) and "band" not in one
