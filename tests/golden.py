"""Helpers for golden decision logs: hand-made traces, a fixed cost, readable logs."""

from __future__ import annotations

import numpy as np

from schedsim.core.policy import Requests
from schedsim.core.simulate import simulate
from schedsim.traces.table import Trace


class FixedCost:
    """Service time in milliseconds as a function of samples; no randomness."""

    def __init__(self, ms):
        self.ms = ms if callable(ms) else (lambda samples: ms)

    def sample_s(self, samples, seq_len, rng):
        return self.ms(samples) / 1e3


def run(arrivals_ms, policy, service_ms=1.0, instances=1, **columns):
    """Simulate and return (log, result); log entries are (t_ms, what, instance, rows)."""
    trace = Trace.from_arrivals(np.asarray(arrivals_ms, dtype=float) / 1e3, **columns)
    result = simulate(Requests.from_trace(trace), policy, FixedCost(service_ms),
                      instances=instances, record=True)
    log = [(round(t / 1e6, 6), what, inst, list(rows)) for t, what, inst, rows in result.decisions]
    return log, result


class Sticky:
    """A user's router: everything to the last active replica."""

    def reset(self, requests, replicas):
        pass

    def route(self, now_ns, row, active):
        return active[-1]

    def on_start(self, now_ns, replica, count):
        pass

    def on_done(self, now_ns, replica, count):
        pass
