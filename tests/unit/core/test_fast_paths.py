"""The request-level run's shortcuts change no result.

- one instance whose policy has a queue rule runs without events or Decision objects;
- the driver completes a batch due before every other event inline, without an event;
- service-time uniforms come from blocks drawn ahead, the same numbers as single draws;
- the per-request columns come from the batch log (a repeat when batches tile the rows);
- summarize takes its percentiles in one partial sort and converts ns to ms in place;
- integer trace columns are parsed straight to their types, falling back to float64.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import DynamicBatcher, NoBatching, StaticBatching
from schedsim.cost.model import CostModel
from schedsim.errors import InputError
from schedsim.core.metrics import PERCENTILES, summarize
from schedsim.core.policy import Requests
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.cost.protocols import BatchCost
from schedsim.core.events import EventLoop
from schedsim.core.simulate import _Driver, _uniforms
from schedsim.traces.table import Trace
from schedsim.traces.io import load_trace, save_trace

PROPS = settings(max_examples=120, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COLUMNS = ("start_ns", "end_ns", "batch_size", "instance", "status", "batch_start_ns", "batch_end_ns",
           "batch_instance", "batch_samples", "batch_requests")


@pytest.fixture(scope="module")
def cost():
    return CostModel.from_profile(load_profile(default_profile_path()))


class Delegating(BatchCost):
    """The same cost model behind a wrapper: the driver cannot tell that it draws one
    uniform per batch, so it passes the Generator itself (single draws)."""

    def __init__(self, model):
        self.model = model
        self.wake_ns, self.wake_is_random = model.wake_ns, model.wake_is_random
        self.power_cap, self.dispatch_s = model.power_cap, model.dispatch_s

    def sample_s(self, samples, seq_len, rng):
        return self.model.sample_s(samples, seq_len, rng)


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 150))
    gaps = draw(st.lists(st.sampled_from([0, 10, 100, 300, 1000, 5000]), min_size=n, max_size=n))
    samples = draw(st.lists(st.integers(1, draw(st.sampled_from([1, 3]))), min_size=n, max_size=n))
    priority = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    timeout_us = draw(st.lists(st.sampled_from([0, 0, 400, 3000]), min_size=n, max_size=n))
    req = Requests.from_trace(Trace.from_arrivals(np.cumsum(gaps) / 1e6, batch=samples, seq_len=[128] * n,
                                                  priority=priority, timeout_us=timeout_us))
    kind = draw(st.sampled_from(["dynamic", "dynamic-queues", "static", "none"]))
    if kind == "dynamic":
        cfg = dict(max_batch_size=draw(st.sampled_from([8, 64])), max_queue_delay_us=draw(st.sampled_from([0, 300])),
                   preferred_batch_sizes=draw(st.sampled_from([(), (2, 4)])), prefetch=draw(st.booleans()))
        make = lambda: DynamicBatcher(**cfg)  # noqa: E731
    elif kind == "dynamic-queues":
        cfg = dict(max_batch_size=8, max_queue_delay_us=300, priority_levels=2, max_queue_size=5,
                   default_timeout_us=2000, timeout_action=draw(st.sampled_from(["REJECT", "DELAY"])),
                   allow_timeout_override=True)
        make = lambda: DynamicBatcher(**cfg)  # noqa: E731
    elif kind == "static":
        size, wait = draw(st.integers(1, 6)), draw(st.sampled_from([0, 500]))
        make = lambda: StaticBatching(size, wait)  # noqa: E731
    else:
        make = NoBatching
    return req, make, draw(st.integers(1, 3)), draw(st.integers(0, 3))


@PROPS
@given(scenarios())
def test_inline_completions_and_block_uniforms_give_the_same_run(cost, scenario):
    req, make, instances, seed = scenario
    fast = _Driver(req, make(), cost, instances, seed, True).run()
    # An event loop passed in turns inline completions off; the wrapper, block uniforms.
    plain = _Driver(req, make(), Delegating(cost), instances, seed, True, EventLoop()).run()
    assert fast.decisions == plain.decisions
    for name in COLUMNS:
        a, b = getattr(fast, name), getattr(plain, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name


def without_rule(policy):
    """``policy`` with no queue rule: the driver takes the general path of events and decisions."""
    policy.queue_rule = lambda: None
    return policy


@PROPS
@given(scenarios(), st.sampled_from([0, 1, 1000, 7]))
def test_queue_rules_give_the_general_run(cost, scenario, seq_seed):
    """The one-instance loop on a policy's queue rule (Policy.queue_rule) against the event
    loop and ``decide``: the same result, column for column and bit for bit."""
    req, make, instances, seed = scenario
    fast_driver = _Driver(req, make(), cost, 1, seed + seq_seed, False)
    fast = fast_driver.run()
    plain = _Driver(req, without_rule(make()), cost, 1, seed + seq_seed, False).run()
    for name in COLUMNS:
        a, b = getattr(fast, name), getattr(plain, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    # Several instances always take the general path.
    assert _Driver(req, make(), cost, 2, seed, False)._queue_rule() is None
    assert len(req) == 0 or fast_driver.delivered == len(req)


@pytest.mark.parametrize("make", [lambda: DynamicBatcher(max_batch_size=8, max_queue_delay_us=300),
                                  lambda: DynamicBatcher(max_batch_size=8, preferred_batch_sizes=(2, 4)),
                                  lambda: StaticBatching(4), lambda: StaticBatching(4, 500), NoBatching])
def test_queue_rules_are_used_on_one_instance(cost, make):
    req = Requests.from_trace(Trace.from_arrivals(np.cumsum(np.full(300, 1e-4)), seq_len=[128] * 300))
    for record in (False, True):
        driver = _Driver(req, make(), cost, 1, 0, record)
        driver.policy.reset(req, 1)
        # Recording decisions takes the general path.
        assert (driver._queue_rule() is None) == record


def test_uniform_blocks_are_the_single_draws():
    single = np.random.default_rng(7)
    blocks = _uniforms(np.random.default_rng(7), block=5)
    assert [blocks.random() for _ in range(23)] == [single.random() for _ in range(23)]


def test_tiled_batches_give_the_scattered_columns(cost):
    req = Requests.from_trace(Trace.from_arrivals(np.cumsum(np.full(500, 2e-4)), seq_len=[128] * 500))
    driver = _Driver(req, DynamicBatcher(max_batch_size=8, max_queue_delay_us=300), cost, 2, 0, False)
    tiled = driver.run()
    log = np.frombuffer(driver.log, np.int64).reshape(-1, 6)
    assert not driver.array_rows and len(log) > 50  # every batch a range: the repeat path
    driver.status[:] = 0  # as before _result
    start_ns, batch_size, instance = driver._scatter(log)  # the general path, on the same log
    assert np.array_equal(start_ns, tiled.start_ns) and np.array_equal(driver.done_ns, tiled.end_ns)
    assert np.array_equal(batch_size, tiled.batch_size) and np.array_equal(instance, tiled.instance)


def reference_summary(result, warmup_s):
    """summarize's latency figures as first written: a copy and a sort per percentile."""
    keep = result.requests.arrival_ns >= int(round(warmup_s * 1e9))
    done = keep & (result.status == 2)
    arrival = result.requests.arrival_ns[done]
    latency = (result.end_ns[done] - arrival) / 1e6
    out = {key: float(np.percentile(latency, q)) for key, q in PERCENTILES.items()}
    out |= {"mean_ms": float(latency.mean()), "max_ms": float(latency.max()),
            "mean_queue_ms": float(((result.start_ns[done] - arrival) / 1e6).mean())}
    return out


@pytest.mark.parametrize("warmup_s, queue_size", [(0.0, 0), (0.05, 0), (0.0, 3)])
def test_summary_latencies_are_the_plain_numpy_ones(cost, warmup_s, queue_size):
    rng = np.random.default_rng(3)
    req = Requests.from_trace(Trace.from_arrivals(np.cumsum(rng.exponential(1e-4, 3000)), seq_len=[128] * 3000))
    policy = DynamicBatcher(max_batch_size=16, max_queue_delay_us=500, max_queue_size=queue_size)
    result = _Driver(req, policy, cost, 1, 1, False).run()
    got = summarize(result, warmup_s)
    assert (queue_size and got["rejected"]) or not queue_size
    for key, value in reference_summary(result, warmup_s).items():
        assert got[key] == value, key


def test_integer_columns_parse_straight_or_through_float64(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,batch,seq_len,timeout_us\n0.1,2,128,0\n0.2,1,64,500\n")
    trace = load_trace(path)
    assert trace.batch.dtype == np.int32 and trace.seq_len.tolist() == [128, 64]
    assert trace.timeout_us.dtype == np.int64 and trace.timeout_us.tolist() == [0, 500]
    # Whole numbers written as floats fail the integer parse and load through float64.
    path.write_text("arrival_s,batch,seq_len\n0.1,2.0,1e2\n")
    assert load_trace(path).seq_len.tolist() == [100]
    for bad, message in (("5.5", "5.5 is not a whole number"), ("", "is empty or NaN"),
                         ("3000000000", "3000000000 is out of range")):
        path.write_text(f"arrival_s,seq_len\n0.1,1\n0.2,{bad}\n")
        with pytest.raises(InputError, match=f"t.csv:3: seq_len: {message}"):
            load_trace(path)


def test_parquet_integer_columns_keep_their_values(tmp_path):
    trace = Trace.from_arrivals([0.0, 0.5, 1.0], batch=[1, 4, 2], seq_len=[32, 128, 64], priority=[0, 2, 1],
                                timeout_us=[0, 10**12, 7])
    path = save_trace(trace, tmp_path / "t.parquet")
    back = load_trace(path)
    for name in ("batch", "seq_len", "priority", "timeout_us", "request_id"):
        a, b = getattr(trace, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
