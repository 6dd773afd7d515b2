"""Capacity and headroom (schedsim.planning.capacity) against closed forms and queueing theory."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from policies import DynamicBatcher, NoBatching, StaticBatching
from schedsim.core.metrics import summarize
from schedsim.core.policy import Requests
from schedsim.core.simulate import simulate
from schedsim.planning.capacity import (Capacity, burst, gpu_busy_fraction, highest_meeting, keeps_up,
                                        saturation)


class LinearCost:
    """Deterministic service: ``base_s + per_sample_s * samples``."""

    def __init__(self, base_s: float, per_sample_s: float = 0.0):
        self.base_s, self.per_sample_s = base_s, per_sample_s

    def sample_s(self, samples, seq_len, rng):
        rng.random()
        return self.base_s + self.per_sample_s * samples


def requests_at(arrival_s, samples=None) -> Requests:
    arrival_ns = np.rint(np.asarray(arrival_s, dtype=float) * 1e9).astype(np.int64)
    n = arrival_ns.size
    ones = np.ones(n, np.int32) if samples is None else np.asarray(samples, np.int32)
    zeros = np.zeros(n, np.int32)
    return Requests(arrival_ns, ones, zeros, zeros.astype(np.int16), np.zeros(n, np.int64), zeros, zeros)


def poisson(rate: float, n: int, seed: int = 0) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))


@pytest.mark.parametrize("instances", [1, 3])
def test_no_batching_saturates_at_instances_over_the_cost_of_one(instances):
    cost = LinearCost(1e-3)
    rate, batch = saturation(requests_at(poisson(100, 500)), NoBatching(), cost, simulate, instances=instances)
    assert batch == 1.0
    assert rate == pytest.approx(instances / 1e-3, rel=0.01)


def test_dynamic_saturates_at_max_batch_over_the_cost_of_a_max_batch():
    cost = LinearCost(1e-3, 50e-6)
    rate, batch = saturation(requests_at(poisson(100, 500)), DynamicBatcher(max_batch_size=16), cost, simulate)
    assert batch == pytest.approx(16, rel=0.01)
    assert rate == pytest.approx(16 / (1e-3 + 16 * 50e-6), rel=0.01)


def test_dynamic_with_preferred_sizes_saturates_at_the_largest_preferred_size():
    cost = LinearCost(1e-3, 50e-6)
    policy = DynamicBatcher(max_batch_size=64, preferred_batch_sizes=(8, 16))
    rate, batch = saturation(requests_at(poisson(100, 500)), policy, cost, simulate)
    assert batch == pytest.approx(16, rel=0.01)
    assert rate == pytest.approx(16 / (1e-3 + 16 * 50e-6), rel=0.01)


def test_static_saturates_at_its_batch_and_counts_samples_per_request():
    cost = LinearCost(2e-3, 100e-6)
    # Two samples per request: 8 requests of a static batch are 16 samples.
    rate, batch = saturation(requests_at(poisson(100, 500), np.full(500, 2)), StaticBatching(batch_size=8),
                             cost, simulate)
    assert batch == pytest.approx(16, rel=0.01)
    assert rate == pytest.approx(8 / (2e-3 + 16 * 100e-6), rel=0.01)


def test_burst_keeps_the_request_mix_all_at_time_zero():
    req = requests_at([0.0, 1.0, 2.0], [1, 2, 3])
    b = burst(req, 7)
    assert b.arrival_ns.tolist() == [0] * 7
    assert b.samples.tolist() == [1, 2, 3, 1, 2, 3, 1]


def test_md1_highest_rate_meeting_a_mean_latency_slo_matches_pollaczek_khinchine():
    """M/D/1: W = D + rho D / (2 (1 - rho)). With W <= 2.5 D the highest load is rho = 0.75."""
    service_s = 1e-3
    cost = LinearCost(service_s)
    base = poisson(100.0, 100_000, seed=3)   # 100 req/s; scaled by the search

    def meets(multiple: float) -> bool:
        summary = summarize(simulate(requests_at(base / multiple), NoBatching(), cost, seed=1))
        return summary["mean_ms"] <= 2.5 * service_s * 1e3 and keeps_up(summary)

    saturation_rps = 1 / service_s
    best = 100.0 * highest_meeting(meets, saturation_rps / 100.0, tolerance=0.01)
    x = 2 * (2.5 - 1)          # rho / (1 - rho)
    expected = x / (1 + x) / service_s
    assert best == pytest.approx(expected, rel=0.03)


def test_mm1_saturation_is_mu_and_throughput_never_passes_it():
    """M/M/1 at twice the service rate: throughput stays at mu, the saturation rate measured."""
    class ExpCost(LinearCost):
        def sample_s(self, samples, seq_len, rng):
            return -math.log(1.0 - rng.random()) * self.base_s

    cost = ExpCost(1e-3)
    sat, _ = saturation(requests_at(poisson(100, 5_000)), NoBatching(), cost, simulate, seed=2)
    assert sat == pytest.approx(1e3, rel=0.05)
    over = summarize(simulate(requests_at(poisson(2_000, 20_000, seed=4)), NoBatching(), cost, seed=5))
    assert over["throughput_rps"] == pytest.approx(sat, rel=0.05)
    assert not keeps_up(over)


def test_highest_meeting_finds_a_threshold_and_says_zero_when_nothing_meets():
    assert highest_meeting(lambda x: x <= 37.0, 100.0, tolerance=1e-3) == pytest.approx(37.0, rel=1e-3)
    assert highest_meeting(lambda x: True, 100.0) == 100.0
    assert highest_meeting(lambda x: False, 100.0) == 0.0


def test_headroom_and_work_share():
    cap = Capacity(saturation_rps=1000.0, offered_rps=250.0, mean_batch=8.0)
    assert cap.capacity_rps == 1000.0 and cap.headroom == 4.0 and cap.work_share == 0.25
    slo = Capacity(saturation_rps=1000.0, offered_rps=250.0, slo_rps=500.0, slo=("p99_ms<=5",))
    assert slo.capacity_rps == 500.0 and slo.headroom == 2.0 and slo.work_share == 0.25
    s = slo.summary()
    assert s["capacity_rps"] == 500.0 and s["capacity"]["saturation_rps"] == 1000.0
    assert "p99_ms<=5" in s["capacity"]["basis"]
    assert math.isnan(Capacity(1000.0, float("nan")).headroom)


def test_gpu_busy_fraction_is_the_union_of_the_instances_batches():
    ns = 1_000_000
    result = SimpleNamespace(batch_start_ns=np.array([0, 1, 6]) * ns, batch_end_ns=np.array([2, 3, 10]) * ns)
    # Busy 0-3 and 6-10 of 0-10.
    assert gpu_busy_fraction(result) == pytest.approx(0.7)
    assert gpu_busy_fraction(result, warmup_s=0.005) == pytest.approx(4 / 5)


def test_near_capacity_warns_between_the_threshold_and_overload_only():
    from schedsim.planning.capacity import NEAR_CAPACITY_SHARE, near_capacity_warning

    def at(share):
        return {"gpu_work_share": share, "capacity": {"saturation_rps": 2504.0}}

    warning = near_capacity_warning(at(0.94))
    assert warning.startswith("near capacity: the offered rate is 94% of") and "2,504 req/s" in warning
    assert "\n" not in warning
    for share in (0.5, NEAR_CAPACITY_SHARE, 1.02, float("nan"), None):
        assert near_capacity_warning(at(share)) is None
    assert near_capacity_warning({}) is None


def test_a_run_near_capacity_says_so_and_one_with_room_does_not(tmp_path):
    """Through the CLI: M/D/1 at 95% and at 50% of the saturation rate."""
    import json

    from cli_helpers import schedsim

    rng = np.random.default_rng(3)
    for load, warned in ((0.95, True), (0.5, False)):
        trace = tmp_path / f"t{load}.csv"
        arrivals = np.cumsum(rng.exponential(1e-3 / load, 4000))  # 1 ms service: saturation 1,000 req/s
        trace.write_text("arrival_s\n" + "\n".join(f"{a:.9f}" for a in arrivals) + "\n")
        profile = tmp_path / "p.csv"
        profile.write_text("batch,latency_ms_mean,latency_ms_p50,latency_ms_p90,latency_ms_p99,latency_ms_std,n\n"
                           "1,1.0,1.0,1.0,1.0,0.0,100\n")
        proc = schedsim("run", trace, "--policy", "none", "--profile", profile, "--spread", "none", "--json")
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout)
        assert any(w.startswith("near capacity") for w in summary.get("warnings", [])) is warned, summary
