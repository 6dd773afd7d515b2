"""Regression tests for MyPolicy: a golden decision log on a hand-made scenario.

No profile, no GPU: the cost object is three lines, so every time in the log is exact.
Run with: python -m pytest docs/examples/test_my_policy_example.py
"""

import numpy as np

from my_policy import MyPolicy
from schedsim.core.policy import Requests
from schedsim.core.simulate import simulate
from schedsim.traces.table import Trace


class FlatCost:
    """Every batch takes 1 ms, whatever its size (the driver only calls sample_s)."""

    def sample_s(self, samples, seq_len, rng):
        return 0.001


def requests_at(*arrival_ms):
    return Requests.from_trace(Trace.from_arrivals(np.array(arrival_ms) / 1e3))


def test_golden_decision_log():
    req = requests_at(0.0, 0.2, 0.3, 0.4, 3.0)
    result = simulate(req, MyPolicy(batch_size=2, timeout_us=500), FlatCost(), record=True)
    assert result.decisions == [
        # (time_ns, "launch", instance, rows)
        (200_000, "launch", 0, (0, 1)),    # the second arrival fills the batch
        (1_200_000, "launch", 0, (2, 3)),  # full at 0.4 ms; waited for the instance
        (3_500_000, "launch", 0, (4,)),    # alone: leaves when its 500 us timeout expires
    ]
    assert result.end_ns.tolist() == [1_200_000, 1_200_000, 2_200_000, 2_200_000, 4_500_000]


def test_decide_without_a_simulator():
    policy = MyPolicy(batch_size=4, timeout_us=500)
    policy.reset(requests_at(0.0, 0.1), instances=1)
    policy.on_arrivals(100_000, 0, 2)
    d = policy.decide(100_000, idle=[0])
    assert d.launches == [] and d.wake_at_ns == 500_000 and d.wake_on_arrival
    d = policy.decide(500_000, idle=[0])
    assert [(l.instance, l.rows.tolist()) for l in d.launches] == [(0, [0, 1])]
