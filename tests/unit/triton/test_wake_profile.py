"""The wake curve from traced lone requests (schedsim.triton.wake_profile), on synthetic
trace stamps whose extra time is known: the curve must return it."""

from __future__ import annotations

import numpy as np
import pytest

from schedsim.cost.wake import WakeCurve
from schedsim.errors import InputError
from schedsim.triton.wake_profile import GAPS_MS, ID_BASE, gap_schedule, wake_curve_from_trace

BUSY_US = 700.0
PATH_US = 400.0  # client round trip: the instance idles the pause plus this


def _stamps(gaps_s, extra_of_idle, start_ns=10**12):
    """Lone requests one after another: each starts PATH_US + its pause after the last ended and
    takes BUSY_US + extra_of_idle(idle)."""
    stamps, t = {}, start_ns
    for k, gap in enumerate(gaps_s):
        idle_us = gap * 1e6 + PATH_US
        t += int(idle_us * 1e3)
        end = t + int((BUSY_US + extra_of_idle(idle_us)) * 1e3)
        stamps[str(ID_BASE + k)] = {"REQUEST_START": t, "QUEUE_START": t + 1000, "REQUEST_END": end}
        t = end
    return stamps


def test_gap_schedule_holds_each_pause_equally_in_a_seeded_order():
    a = gap_schedule(7, np.random.default_rng(3))
    b = gap_schedule(7, np.random.default_rng(3))
    assert np.array_equal(a, b) and a.size == 7 * len(GAPS_MS)
    values, counts = np.unique(a, return_counts=True)
    assert np.allclose(values * 1e3, GAPS_MS) and set(counts) == {7}
    assert not np.array_equal(a, np.sort(a))


def test_the_curve_recovers_a_known_extra_by_idle_time():
    gaps = gap_schedule(20, np.random.default_rng(0))
    extra = lambda idle_us: 50.0 * np.log1p(idle_us / 100.0)  # noqa: E731 - grows with idling
    curve = wake_curve_from_trace(_stamps(gaps, extra), gaps, BUSY_US)
    assert len(curve["idle_us"]) == len(GAPS_MS) and sum(curve["n"]) == gaps.size - 5  # warm-up left out
    for g, idle, e in zip(GAPS_MS, curve["idle_us"], curve["extra_us"]):
        assert idle == pytest.approx(g * 1e3 + PATH_US, abs=1.0)
        assert e == pytest.approx(extra(idle), abs=1.0)
    assert curve["floored_fraction"] == 0.0
    # The sidecar's curve loads and prices an idle launch as measured.
    wc = WakeCurve(curve["idle_us"], curve["extra_us"], probs=curve["probs"], extra_q_us=curve["extra_q_us"])
    assert wc.extra_ns(int(5400e3)) == pytest.approx(extra(5400.0) * 1e3, rel=0.01)


def test_negative_extras_are_floored_and_counted():
    gaps = gap_schedule(10, np.random.default_rng(1))
    curve = wake_curve_from_trace(_stamps(gaps, lambda idle: -100.0 if idle < 1000 else 200.0), gaps, BUSY_US)
    assert curve["floored_fraction"] > 0
    assert all(v >= 0 for row in curve["extra_q_us"] for v in row) and min(curve["extra_raw_mean_us"]) < 0


def test_too_few_traced_requests_is_one_line():
    gaps = gap_schedule(1, np.random.default_rng(2))
    with pytest.raises(InputError, match="usable trace records"):
        wake_curve_from_trace(_stamps(gaps, lambda idle: 0.0), gaps, BUSY_US)
    with pytest.raises(InputError, match="trace records"):
        wake_curve_from_trace({}, gaps, BUSY_US)
