"""The compiled loop of the dynamic, static and no-batching rules (schedsim.core.compiled_queue)
gives the Python loop's results bit for bit: every per-request and per-batch column, the
warnings, the errors, on random traces, batcher settings, profiles, spreads, wake-up costs and
power caps."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import DynamicBatcher, NoBatching, StaticBatching
from schedsim.core import compiled_queue
from schedsim.core.policy import Requests
from schedsim.core.simulate import simulate
from schedsim.cost.model import CostModel
from schedsim.cost.profile import load_profile
from schedsim.cost.wake import WakeCurve
from schedsim.traces.table import Trace

if compiled_queue._queue_run is None:
    if os.environ.get("SCHEDSIM_REQUIRE_SPEEDUPS") == "1":
        raise RuntimeError("schedsim.core._queue_run is not built (setup.py), and SCHEDSIM_REQUIRE_SPEEDUPS=1")
    pytest.skip("the C extension is not built here", allow_module_level=True)

PROFILES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "profiles")
COLUMNS = ("start_ns", "end_ns", "batch_size", "instance", "status", "batch_start_ns", "batch_end_ns",
           "batch_instance", "batch_samples", "batch_requests")
PROPS = settings(max_examples=250, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def profile(name):
    return load_profile(os.path.join(PROFILES, name))


PROFILE_NAMES = ["bert-base-fp16-cg-h200.csv",          # power cap, wake curve with quantiles
                 "bert-base-fp16-cg-3seq-h200.csv",     # three seq_lens: blended entries
                 "bert-base-fp16-triton-http-h200.csv",  # wake curve, no power cap
                 "bert-tiny-fp32-ort-cpu.csv"]
_LOADED = {}


def cost_model(name, spread, extrapolate, wake, power_cap):
    if name not in _LOADED:
        _LOADED[name] = profile(name)
    cost = CostModel.from_profile(_LOADED[name], spread=spread, extrapolate=extrapolate, power_cap=power_cap,
                                  wake_overhead_s=4e-5 if wake == "constant" else None)
    if wake == "mean curve":
        cost.wake_curve = WakeCurve([50, 400, 20000], [80, 150, 600])
    elif wake == "quantile curve":
        cost.wake_curve = WakeCurve([50, 400, 20000], [80, 150, 600], probs=[0, 0.5, 0.9, 1],
                                    extra_q_us=[[10, 70, 150, 400], [20, 120, 300, 900], [100, 500, 900, 3000]])
    return cost


def both(req, make_policy, make_cost, seed):
    """Results (or the error) of the compiled loop and of the Python loop, with their warnings."""
    out = []
    for enabled in (True, False):
        compiled_queue.ENABLED = enabled
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = simulate(req, make_policy(), make_cost(), seed=seed)
            out.append((result, [str(w.message) for w in caught]))
        except ValueError as exc:
            out.append((None, str(exc)))
        finally:
            compiled_queue.ENABLED = True
    return out


def assert_same(a, b):
    (ra, wa), (rb, wb) = a, b
    assert wa == wb
    assert (ra is None) == (rb is None)
    if ra is None:
        return
    for column in COLUMNS:
        assert np.array_equal(getattr(ra, column), getattr(rb, column)), column


@st.composite
def runs(draw):
    n = draw(st.integers(1, 400))
    scale = draw(st.sampled_from([10, 100, 400, 2000]))
    gaps = draw(st.lists(st.integers(0, 4 * scale), min_size=n, max_size=n))
    name = draw(st.sampled_from(PROFILE_NAMES))
    extrapolate = draw(st.booleans())
    if extrapolate:
        seq_len, most = draw(st.sampled_from([128, 32, 64, 200, 384, 500])), draw(st.sampled_from([1, 4, 8, 64, 96]))
    else:  # inside the profile: on its seq_lens or between them
        measured = sorted(set(int(s) for s in cost_model(name, "auto", False, "profile", True)._s))
        seq_len = draw(st.integers(measured[0], measured[-1]))
        most = draw(st.sampled_from([1, 4, 8, 64]))
    req = Requests.from_trace(Trace.from_arrivals(np.cumsum(gaps) / 1e6 + draw(st.sampled_from([0, 1.5])),
                                                  seq_len=[seq_len] * n))
    preferred = draw(st.lists(st.integers(1, most), max_size=3))
    delay = draw(st.sampled_from([0, 50, 300, 1000, 5000]))
    spread = draw(st.sampled_from(["auto", "fitted", "empirical"]))
    wake = draw(st.sampled_from(["profile", "constant", "mean curve", "quantile curve"]))
    power_cap = draw(st.booleans())

    kind = draw(st.sampled_from(["dynamic", "dynamic", "static", "none"]))

    def make_policy():
        if kind == "static":
            return StaticBatching(batch_size=most, max_wait_us=delay)
        if kind == "none":
            return NoBatching()
        return DynamicBatcher(max_batch_size=most, preferred_batch_sizes=preferred, max_queue_delay_us=delay)

    def make_cost():
        return cost_model(name, spread, extrapolate, wake, power_cap)
    return req, make_policy, make_cost, draw(st.integers(0, 5))


@PROPS
@given(runs())
def test_the_compiled_loop_is_the_python_loop(run):
    req, make_policy, make_cost, seed = run
    compiled, python = both(req, make_policy, make_cost, seed)
    assert_same(compiled, python)


def test_it_runs_where_it_covers_and_not_elsewhere(monkeypatch):
    """Covered runs take the compiled loop; others (several samples a request, a subclass of
    CostModel, several instances) the Python one."""
    real, taken = compiled_queue.run, []

    def counting(driver, rule):
        taken.append(1)
        real(driver, rule)
    monkeypatch.setattr(compiled_queue, "run", counting)
    cost = cost_model("bert-base-fp16-cg-h200.csv", "auto", False, "profile", True)
    arrivals = np.arange(50) * 1e-4
    for policy in (DynamicBatcher(max_batch_size=8, max_queue_delay_us=100), NoBatching(), StaticBatching(4, 50)):
        simulate(Requests.from_trace(Trace.from_arrivals(arrivals, seq_len=[128] * 50)), policy, cost)
    assert taken == [1, 1, 1]

    class Priced(CostModel):
        pass

    priced = Priced.from_profile(profile("bert-base-fp16-cg-h200.csv"))
    for req, policy, model, instances in [
            (Requests.from_trace(Trace.from_arrivals(arrivals, batch=[2] * 50, seq_len=[128] * 50)),
             DynamicBatcher(max_batch_size=8, max_queue_delay_us=100), cost, 1),
            (Requests.from_trace(Trace.from_arrivals(arrivals, seq_len=[128] * 50)),
             DynamicBatcher(max_batch_size=8, max_queue_delay_us=100), priced, 1),
            (Requests.from_trace(Trace.from_arrivals(arrivals, seq_len=[128] * 50)),
             DynamicBatcher(max_batch_size=8, max_queue_delay_us=100), cost, 2)]:
        simulate(req, policy, model, instances=instances)
    assert taken == [1, 1, 1]


def test_a_size_the_profile_does_not_cover_fails_as_in_python():
    """Without extrapolation, a batch larger than the profile's largest raises the same error
    at the same batch."""
    req = Requests.from_trace(Trace.from_arrivals(np.zeros(100), seq_len=[128] * 100))
    compiled, python = both(req, lambda: DynamicBatcher(max_batch_size=96, max_queue_delay_us=0),
                            lambda: cost_model("bert-base-fp16-cg-h200.csv", "auto", False, "profile", True), 1)
    assert compiled[0] is None and "covers batch sizes" in compiled[1]
    assert_same(compiled, python)


def test_a_long_run_draws_many_blocks_of_uniforms():
    rng = np.random.default_rng(3)
    n = 60_000
    req = Requests.from_trace(Trace.from_arrivals(np.cumsum(rng.exponential(1 / 9000, n)), seq_len=[128] * n))
    compiled, python = both(req, lambda: DynamicBatcher(max_batch_size=4, max_queue_delay_us=0),
                            lambda: cost_model("bert-base-fp16-cg-h200.csv", "auto", False, "profile", True), 7)
    assert len(compiled[0].batch_start_ns) > 3 * 4096  # blocks of 4,096, 8,192, ...
    assert_same(compiled, python)
