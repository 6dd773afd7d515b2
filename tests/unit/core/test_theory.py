"""Queueing theory as an oracle for the simulator.

With batch size 1 the simulator is a FIFO queue, so it must reproduce M/M/1, M/D/1,
M/G/1 (Pollaczek-Khinchine) and M/M/c (Erlang C); with batching, Little's law must
still hold on every run, and static batching with deterministic arrivals and service
has a closed form on both sides of saturation.

How the statistical checks are made sound
-----------------------------------------
Mean sojourn times in a busy queue converge slowly: successive sojourns are strongly
correlated. The standard errors quoted below were measured offline from 300-400
independent replications of the exact Lindley recursion (numpy, same n and load); they
are relative SEs of the mean over all replications of a test.

Each replication's estimate is compared with the formula evaluated at the *realised*
arrival and service rates of that replication (the sample means of its interarrival
and service times): a plug-in control variate that removes the part of the noise that
comes from the realised load (W is steep in rho: dW/W = drho/(1-rho)). It cuts the SE
by a third at rho = 0.8. The realised rates themselves are checked against the nominal
ones, so the test still runs at the load it claims. Tolerances are >= 3.3 SE.

Replications run in up to two worker processes (the suite's target machine has two
cores); seeds are fixed, so the outcome does not depend on the number of workers.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from policies import DynamicBatcher, NoBatching, StaticBatching
from schedsim.core.metrics import queue_length
from schedsim.core.policy import Requests
from schedsim.core.results import COMPLETED
from schedsim.core.simulate import simulate
from schedsim.traces.table import Trace

PROFILE = Path(__file__).resolve().parents[3] / "profiles" / "bert-base-fp16-cg-h200.csv"

MEAN_SERVICE_S = 1e-3  # 1/mu for the single-sample tests


# --- cost models ---------------------------------------------------------------------------

class ExpCost:
    """Exponential service, mean ``base_s + per_sample_s * samples``."""

    def __init__(self, base_s: float, per_sample_s: float = 0.0):
        self.base_s, self.per_sample_s = base_s, per_sample_s

    def sample_s(self, samples, seq_len, rng):
        return rng.exponential(self.base_s + self.per_sample_s * samples)


class FixedCost:
    """Deterministic service, ``base_s + per_sample_s * samples``."""

    def __init__(self, base_s: float, per_sample_s: float = 0.0):
        self.base_s, self.per_sample_s = base_s, per_sample_s

    def sample_s(self, samples, seq_len, rng):
        return self.base_s + self.per_sample_s * samples


POLICIES = {
    "none": NoBatching,
    "dynamic1": lambda: DynamicBatcher(max_batch_size=1),
}


# --- formulas ------------------------------------------------------------------------------

def w_mm1(lam, mu):
    return 1.0 / (mu - lam)


def w_md1(lam, mu):
    rho = lam / mu
    return 1.0 / mu + rho / (2.0 * mu * (1.0 - rho))


def w_mg1(lam, mean_s, second_moment_s2):
    """Pollaczek-Khinchine mean sojourn for general service."""
    rho = lam * mean_s
    return mean_s + lam * second_moment_s2 / (2.0 * (1.0 - rho))


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load a = lam/mu (< c)."""
    # sum_{k<c} a^k/k! = e^a * P(Poisson(a) <= c-1)
    below = math.exp(a) * stats.poisson.cdf(c - 1, a)
    top = a ** c / math.factorial(c) * c / (c - a)
    return top / (below + top)


def w_mmc(lam, mu, c):
    return erlang_c(c, lam / mu) / (c * mu - lam) + 1.0 / mu


# --- running replications ----------------------------------------------------------------

def poisson_requests(n: int, lam: float, seed: int) -> tuple[Requests, np.ndarray]:
    gaps = np.random.default_rng(seed).exponential(1.0 / lam, n)
    return Requests.from_trace(Trace.from_arrivals(np.cumsum(gaps))), gaps


def replicate_single(args) -> tuple[float, float, float, float]:
    """One replication: (mean sojourn s, realised lam, realised mean service s, E[S^2])."""
    policy, service, lam, n, seed, instances = args
    req, gaps = poisson_requests(n, lam, seed)
    cost = (ExpCost(MEAN_SERVICE_S) if service == "exp" else FixedCost(MEAN_SERVICE_S))
    res = simulate(req, POLICIES[policy](), cost, instances=instances, seed=seed + 10_000)
    assert (res.status == COMPLETED).all()
    assert (res.batch_size == 1).all()
    service_s = (res.batch_end_ns - res.batch_start_ns) / 1e9
    sojourn_s = (res.end_ns - req.arrival_ns) / 1e9
    return (float(sojourn_s.mean()), float(1.0 / gaps.mean()), float(service_s.mean()),
            float((service_s ** 2).mean()))


def run_replications(jobs: list) -> np.ndarray:
    workers = min(2, os.cpu_count() or 1, len(jobs))
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return np.array([replicate_single(j) for j in jobs])
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return np.array(list(pool.map(replicate_single, jobs)))


def check_rates(reps: np.ndarray, lam: float, mean_s: float, tol: float) -> None:
    """The realised load is the nominal one (the plug-in must not hide a wrong load)."""
    np.testing.assert_allclose(reps[:, 1].mean(), lam, rtol=tol)
    np.testing.assert_allclose(reps[:, 2].mean(), mean_s, rtol=tol)


# --- M/M/1 -----------------------------------------------------------------------------

# (rho, replications, requests each, relative SE of the mean of ratios, for 2% = k SE)
MM1_SIZES = {
    0.5: (4, 50_000),    # SE 0.46% (raw, without plug-in: 0.69%): 2% = 4.3 SE
    0.8: (6, 170_000),   # SE 0.60% (raw: 0.91%): 2% = 3.3 SE
}


@pytest.mark.slow
@pytest.mark.parametrize("policy,rho", [("none", 0.5), ("none", 0.8), ("dynamic1", 0.5)])
def test_mm1_mean_sojourn_matches_theory(policy, rho):
    mu = 1.0 / MEAN_SERVICE_S
    lam = rho * mu
    reps_n, n = MM1_SIZES[rho]
    reps = run_replications([(policy, "exp", lam, n, 100 * k + int(rho * 10), 1)
                             for k in range(reps_n)])
    check_rates(reps, lam, MEAN_SERVICE_S, 0.01)
    ratio = reps[:, 0] / w_mm1(reps[:, 1], 1.0 / reps[:, 2])
    assert abs(ratio.mean() - 1.0) < 0.02, ratio
    # And against the nominal formula, within 4 raw SE (3.6% at rho 0.8, 2.8% at 0.5).
    raw_tol = {0.5: 0.028, 0.8: 0.036}[rho]
    assert abs(reps[:, 0].mean() / w_mm1(lam, mu) - 1.0) < raw_tol


@pytest.mark.parametrize("rho", [0.5, 0.8])
@pytest.mark.parametrize("instances", [1, 2])
def test_dynamic_with_batch_size_one_is_no_batching_bit_for_bit(rho, instances):
    # Why M/M/1 for dynamic1 at rho = 0.8 (and M/M/2 for none) need not be re-simulated
    # (it would cost 45 s): dynamic with max_batch_size 1 launches the same rows at the same times
    # in the same order as none, so it consumes the same service draws.
    lam = instances * rho / MEAN_SERVICE_S
    req, _ = poisson_requests(20_000, lam, seed=7)
    a = simulate(req, NoBatching(), ExpCost(MEAN_SERVICE_S), instances=instances, seed=3)
    b = simulate(req, DynamicBatcher(max_batch_size=1), ExpCost(MEAN_SERVICE_S),
                 instances=instances, seed=3)
    for col in ("start_ns", "end_ns", "instance", "batch_size", "status", "batch_instance"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col), err_msg=col)


# --- M/D/1, M/G/1 ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("rho,reps_n,n", [
    (0.5, 1, 100_000),   # SE 0.30% (plug-in; raw 0.38%): 2% = 6.7 SE
    (0.8, 2, 200_000),   # SE 0.62% (plug-in; raw 0.82%): 2% = 3.2 SE
])
def test_md1_mean_sojourn_matches_pollaczek_khinchine(rho, reps_n, n):
    mu = 1.0 / MEAN_SERVICE_S
    lam = rho * mu
    reps = run_replications([("none", "det", lam, n, 200 + k, 1) for k in range(reps_n)])
    np.testing.assert_allclose(reps[:, 2], MEAN_SERVICE_S, rtol=1e-9)  # really deterministic
    check_rates(reps, lam, MEAN_SERVICE_S, 0.01)
    ratio = reps[:, 0] / w_md1(reps[:, 1], mu)
    assert abs(ratio.mean() - 1.0) < 0.02, ratio


@pytest.mark.slow
def test_mg1_with_the_measured_bert_profile_matches_pollaczek_khinchine():
    # General service: the empirical latency distribution of BERT-base at batch 1 (CV ~4%).
    from schedsim.cost.model import CostModel
    from schedsim.cost.profile import load_profile

    # M/G/1: one service law, so neither wake-ups nor the power cap's clock.
    cost = CostModel.from_profile(load_profile(PROFILE), spread="empirical", wake_overhead_s=0.0, power_cap=False)
    mean_s = cost.mean_s(1, 128)
    lam = 0.7 / mean_s
    gaps = np.random.default_rng(5).exponential(1.0 / lam, 150_000)
    trace = Trace.from_arrivals(np.cumsum(gaps), seq_len=np.full(gaps.size, 128))
    res = simulate(Requests.from_trace(trace), NoBatching(), cost, seed=11)
    service_s = (res.batch_end_ns - res.batch_start_ns) / 1e9
    assert service_s.std() > 0.01 * service_s.mean()  # not deterministic in disguise
    np.testing.assert_allclose(service_s.mean(), mean_s, rtol=0.005)
    sojourn = ((res.end_ns - res.requests.arrival_ns) / 1e9).mean()
    # SE ~0.35% (M/D/1-like at rho 0.7, 150k requests): 2% = 5.7 SE.
    expected = w_mg1(1.0 / gaps.mean(), service_s.mean(), (service_s ** 2).mean())
    assert abs(sojourn / expected - 1.0) < 0.02


# --- M/M/2 ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("policy", ["dynamic1"])  # none: bit-for-bit the same, tested above
def test_mm2_mean_sojourn_matches_erlang_c(policy):
    # rho = 0.7 per server; SE of the plug-in ratio 1.43% per 50k requests, 0.71% over
    # 4 x 50k: 3% = 4.2 SE (raw SE 1.06%).
    mu, c = 1.0 / MEAN_SERVICE_S, 2
    lam = 0.7 * c * mu
    reps = run_replications([(policy, "exp", lam, 50_000, 300 + k, c) for k in range(4)])
    check_rates(reps, lam, MEAN_SERVICE_S, 0.01)
    ratio = reps[:, 0] / np.array([w_mmc(l, 1.0 / s, c) for l, s in reps[:, 1:3]])
    assert abs(ratio.mean() - 1.0) < 0.03, ratio


def test_erlang_c_formula():
    # The oracle itself: c = 1 reduces to M/M/1 (P(wait) = rho); a textbook value for c = 2.
    assert erlang_c(1, 0.6) == pytest.approx(0.6)
    assert erlang_c(2, 1.0) == pytest.approx(1.0 / 3.0)
    assert w_mmc(0.6, 1.0, 1) == pytest.approx(w_mm1(0.6, 1.0))


# --- Little's law -------------------------------------------------------------------------

def time_average(t_ns: np.ndarray, step: np.ndarray, t0: int, t1: int) -> float:
    """Time average over [t0, t1] of the step function sum(step[t_ns <= t])."""
    order = np.argsort(t_ns, kind="stable")
    t, level = t_ns[order], np.cumsum(step[order])
    edges = np.clip(np.append(t, t1), t0, t1)
    return float((level * np.diff(edges)).sum() / (t1 - t0))


# (policy, instances, arrival rate /s). Batch cost 0.3 ms + 0.1 ms per sample, so one
# instance serves 2.5k requests/s unbatched and 5.7k/s in batches of 4; the last two
# cases are overloaded on purpose and shed load by rejecting.
LITTLE_CASES = {
    "none": (lambda: NoBatching(), 1, 1_750),
    "none-3": (lambda: NoBatching(), 3, 6_000),
    # max_wait_us=0: see test_static_max_wait_wake_in_the_past in test_properties.py.
    "static": (lambda: StaticBatching(batch_size=4), 1, 4_000),
    "dynamic": (lambda: DynamicBatcher(max_batch_size=8, preferred_batch_sizes=[4, 8],
                                       max_queue_delay_us=300), 1, 4_500),
    "dynamic-prefetch-2": (lambda: DynamicBatcher(max_batch_size=8, max_queue_delay_us=500,
                                                  prefetch=True), 2, 9_000),
    "dynamic-queue-policy": (lambda: DynamicBatcher(
        max_batch_size=8, max_queue_delay_us=200, max_queue_size=6, default_timeout_us=1500,
        timeout_action="DELAY", preserve_ordering=True), 1, 8_000),
    "dynamic-reject": (lambda: DynamicBatcher(
        max_batch_size=4, preferred_batch_sizes=[2, 4], max_queue_delay_us=100,
        default_timeout_us=800, timeout_action="REJECT"), 1, 7_000),
}


@pytest.mark.parametrize("case", list(LITTLE_CASES))
def test_littles_law(case):
    make, instances, lam = LITTLE_CASES[case]
    req, _ = poisson_requests(20_000, lam, seed=17)
    res = simulate(req, make(), ExpCost(0.3e-3, 0.1e-3), instances=instances, seed=2)
    assert (res.end_ns >= req.arrival_ns).all() and (res.status >= COMPLETED).all()
    arrival, end = req.arrival_ns, res.end_ns
    # Steady-state window: the middle 80% of the run.
    span0, span1 = int(arrival[0]), int(end.max())
    t0, t1 = span0 + (span1 - span0) // 10, span1 - (span1 - span0) // 10
    n_rows = len(req)

    # In system: +1 at arrival, -1 at the response (or rejection).
    L = time_average(np.concatenate([arrival, end]),
                     np.concatenate([np.ones(n_rows), -np.ones(n_rows)]), t0, t1)
    leaving = (end > t0) & (end <= t1)
    X = leaving.sum() / ((t1 - t0) / 1e9)
    W = ((end - arrival)[leaving] / 1e9).mean()
    assert L == pytest.approx(X * W, rel=0.01)

    # Waiting (arrived, not started), with the queue-length curve from metrics.
    t_s, q = queue_length(res)
    Lq = time_average(np.rint(t_s * 1e9).astype(np.int64), np.diff(q, prepend=0), t0, t1)
    left_q = np.where(res.start_ns >= 0, res.start_ns, end)
    in_win = (left_q > t0) & (left_q <= t1)
    Xq = in_win.sum() / ((t1 - t0) / 1e9)
    Wq = ((left_q - arrival)[in_win] / 1e9).mean()
    assert Lq == pytest.approx(Xq * Wq, rel=0.01)
    if case in ("dynamic-queue-policy", "dynamic-reject"):
        assert (res.status != COMPLETED).mean() > 0.01  # the rejecting paths were exercised


# --- static batching, deterministic: exact ------------------------------------------------

@pytest.mark.parametrize("service_factor", [0.99, 1.0, 1.01, 1.5])
@pytest.mark.parametrize("batch", [1, 4, 7])
def test_static_deterministic_batch_starts_have_a_closed_form(batch, service_factor):
    # Arrivals every a, service s per batch: batch k fills at (kB + B - 1) a and its
    # instance frees at start_{k-1} + s; the Lindley recursion over batches solves to
    # start_k = (B - 1) a + k max(B a, s) on both sides of saturation (B a = s).
    a_ns = 1_000_000
    s_ns = int(round(service_factor * batch * a_ns))
    n = 300 * batch
    trace = Trace.from_arrivals(np.arange(n) * a_ns / 1e9)
    res = simulate(Requests.from_trace(trace), StaticBatching(batch_size=batch),
                   FixedCost(s_ns / 1e9))
    k = np.arange(n // batch)
    expected = (batch - 1) * a_ns + k * max(batch * a_ns, s_ns)
    np.testing.assert_array_equal(res.batch_start_ns, expected)
    # Mean sojourn: position j of B waits (B - 1 - j) a for the batch to fill, plus the
    # backlog k (s - B a)^+ of batch k, plus s.
    backlog = k.mean() * max(0, s_ns - batch * a_ns)
    sojourn = (res.end_ns - res.requests.arrival_ns).mean()
    assert sojourn == pytest.approx((batch - 1) * a_ns / 2 + backlog + s_ns, rel=1e-12)
