"""The wake-up curve: interpolation in log idle time, quantile draws, validation, and the
driver charging a launch by how long its instance sat idle."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from policies import NoBatching
from schedsim.errors import InputError
from schedsim.core.policy import Requests
from schedsim.core.simulate import simulate
from schedsim.cost.protocols import BatchCost
from schedsim.traces.table import Trace
from schedsim.cost.wake import WakeCurve


def test_interpolates_linearly_in_log_idle_and_is_flat_beyond_the_ends():
    c = WakeCurve([100.0, 10_000.0], [100.0, 500.0])
    assert c.extra_ns(1_000) == 100_000          # 1 us idle: below the first point
    assert c.extra_ns(100_000) == 100_000        # at the first point (100 us)
    assert c.extra_ns(1_000_000) == 300_000      # 1 ms: halfway in log between 0.1 and 10 ms
    assert c.extra_ns(10_000_000) == 500_000
    assert c.extra_ns(10**12) == 500_000         # far beyond the last point


def test_quantiles_pick_by_the_draw_and_a_curve_without_them_returns_the_mean():
    c = WakeCurve([100.0], [150.0], probs=[0.0, 0.5, 1.0], extra_q_us=[[0.0, 100.0, 400.0]])
    assert c.random
    assert [c.extra_ns(50_000, u) for u in (0.0, 0.25, 0.5, 0.75)] == [0, 50_000, 100_000, 250_000]
    assert not WakeCurve([100.0], [150.0]).random
    assert WakeCurve([100.0], [150.0]).extra_ns(50_000, 0.9) == 150_000


@given(st.lists(st.floats(0.0, 0.999), min_size=2, max_size=20), st.integers(1, 10**9))
def test_a_quantile_draw_never_decreases_with_u(us, idle_ns):
    c = WakeCurve([50.0, 500.0, 5000.0], [100.0, 200.0, 400.0], probs=[0.0, 0.9, 1.0],
                  extra_q_us=[[0, 150, 600], [20, 300, 900], [100, 500, 1200]])
    draws = [c.extra_ns(idle_ns, u) for u in sorted(us)]
    assert draws == sorted(draws)


@pytest.mark.parametrize("kw, what", [
    (dict(idle_us=[], extra_us=[]), "non-empty"),
    (dict(idle_us=[10, 5], extra_us=[1, 2]), "strictly increasing"),
    (dict(idle_us=[10], extra_us=[-1]), ">= 0"),
    (dict(idle_us=[10], extra_us=[1], probs=[0, 1], extra_q_us=[[5, 1]]), "non-decreasing"),
    (dict(idle_us=[10], extra_us=[1], probs=[0.1, 1], extra_q_us=[[1, 5]]), "probs"),
])
def test_bad_curves_are_refused_with_the_field_named(kw, what):
    with pytest.raises(InputError, match=what):
        WakeCurve(kw.pop("idle_us"), kw.pop("extra_us"), source="x.json: wake_curve", **kw)


class _CurveCost(BatchCost):
    """1 ms per batch; waking costs 100 us after 0.1 ms idle, 900 us after 10 ms (log-linear)."""

    def __init__(self):
        self.curve = WakeCurve([100.0, 10_000.0], [100.0, 900.0])

    def sample_s(self, samples, seq_len, rng):
        return 0.001

    def wake_ns(self, idle_ns, u=0.5):
        return self.curve.extra_ns(idle_ns, u)


def test_the_driver_charges_each_wake_by_the_idle_time_before_it():
    # Row 0 at t=0: idle since the start (1 ns). Row 1 queues during row 0: busy, no wake.
    # Row 2 arrives 1 ms after row 1 ends (geometric middle of the curve: 500 us).
    # Row 3 arrives 20 ms after: beyond the last point (900 us).
    end1 = 0.0011 + 0.001
    req = Requests.from_trace(Trace.from_arrivals([0.0, 0.0005, end1 + 0.001, end1 + 0.001 + 0.0015 + 0.020]))
    result = simulate(req, NoBatching(), _CurveCost(), record=True)
    durations = (result.batch_end_ns - result.batch_start_ns).tolist()
    assert durations == [1_100_000, 1_000_000, 1_500_000, 1_900_000]


def test_the_default_profile_draws_wakes_from_their_own_stream():
    """Wake draws do not shift the service-time draws: with the curve's spread removed the
    service times are the same, and a run repeats bit for bit."""
    from schedsim.cost.model import CostModel
    from schedsim.cost.profile import default_profile_path, load_profile

    profile = load_profile(default_profile_path())
    assert "wake_curve" in profile.meta
    cost = CostModel.from_profile(profile)
    assert cost.wake_is_random
    rng = np.random.default_rng(3)
    req = Requests.from_trace(Trace.from_arrivals(np.cumsum(rng.exponential(0.003, 400))))
    a, b = (simulate(req, NoBatching(), cost, seed=7) for _ in range(2))
    assert np.array_equal(a.end_ns, b.end_ns)
    flat = CostModel.from_profile(profile, wake_overhead_s=0.0)
    c = simulate(req, NoBatching(), flat, seed=7)
    # Same batches (one request each), same service draws: durations differ by the wake alone.
    wake = (a.batch_end_ns - a.batch_start_ns) - (c.batch_end_ns - c.batch_start_ns)
    assert (wake >= 0).all() and (wake > 0).mean() > 0.5
    assert wake.max() <= max(max(q) for q in cost.wake_curve.extra_q_us) * 1e3 + 1
