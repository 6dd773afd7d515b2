"""Golden decision logs: small hand-made scenarios, the exact batch sequence asserted.

Each dynamic-batcher test names the rule of Triton's decision it pins down
(policies/dynamic.py and docs/background/triton-dynamic-batcher.md).
"""

import numpy as np
import pytest

from golden import run
from policies import DynamicBatcher, NoBatching, StaticBatching
from schedsim.cost.protocols import BatchCost
from schedsim.errors import InputError


def launch(t, inst, rows):
    return (t, "launch", inst, rows)


# --- none and static ---------------------------------------------------------------------

def test_none_serves_one_request_per_batch_in_arrival_order():
    log, _ = run([0, 0, 0.5, 3], NoBatching(), service_ms=1.0)
    assert log == [launch(0, 0, [0]), launch(1, 0, [1]), launch(2, 0, [2]), launch(3, 0, [3])]


def test_none_uses_the_lowest_idle_instance_first():
    log, _ = run([0, 0, 0, 0.5], NoBatching(), service_ms=1.0, instances=2)
    assert log == [launch(0, 0, [0]), launch(0, 1, [1]), launch(1, 0, [2]), launch(1, 1, [3])]


def test_static_waits_for_a_full_batch_and_flushes_the_remainder_at_trace_end():
    log, _ = run([0, 1, 2, 3, 4], StaticBatching(batch_size=3), service_ms=0.5)
    assert log == [launch(2, 0, [0, 1, 2]), launch(4, 0, [3, 4])]


def test_static_sends_a_partial_batch_after_max_wait():
    log, _ = run([0, 1, 2, 3, 10, 20], StaticBatching(batch_size=3, max_wait_us=1500), service_ms=0.5)
    # The head waits 1.5 ms at most; the last request leaves at trace end (20 ms).
    assert log == [launch(1.5, 0, [0, 1]), launch(3.5, 0, [2, 3]), launch(11.5, 0, [4]),
                   launch(20, 0, [5])]


def test_static_waits_for_an_instance():
    log, _ = run([0, 0, 0, 0, 0, 0], StaticBatching(batch_size=2), service_ms=5)
    assert log == [launch(0, 0, [0, 1]), launch(5, 0, [2, 3]), launch(10, 0, [4, 5])]


# --- dynamic: the decision -----------------------------------------------------------------

def test_dynamic_no_preferred_waits_for_the_delay_measured_from_the_oldest_request():
    # Rule 3: no preferred sizes (Triton treats it as [max_batch_size]); the batch leaves
    # when the head has waited the delay, not when the newest request has.
    log, _ = run([0, 0.2, 0.4, 5.0], DynamicBatcher(max_batch_size=4, max_queue_delay_us=1000),
                 service_ms=0.5)
    assert log == [launch(1.0, 0, [0, 1, 2]), launch(6.0, 0, [3])]


def test_dynamic_sends_at_once_when_max_batch_size_is_queued():
    # Rule 2: the walk hits max_batch_size: send without waiting for the delay.
    log, _ = run([0, 0.1, 0.2, 0.3, 0.4], DynamicBatcher(max_batch_size=4, max_queue_delay_us=10_000),
                 service_ms=0.5)
    assert log == [launch(0.3, 0, [0, 1, 2, 3]), launch(10.4, 0, [4])]


def test_dynamic_sends_a_preferred_size_as_soon_as_it_forms():
    # Rule 1: the running total equals a preferred size and the delay has not expired.
    log, _ = run([0, 1, 2, 3], DynamicBatcher(max_batch_size=8, preferred_batch_sizes=(2, 4),
                                              max_queue_delay_us=10_000), service_ms=0.5)
    assert log == [launch(1, 0, [0, 1]), launch(3, 0, [2, 3])]


def test_dynamic_best_is_marked_where_the_next_request_would_pass_the_largest_preferred():
    # Preferred [4]; request 0 carries 3 samples, request 1 carries 2: 3 + 2 > 4 with no
    # preferred hit yet, so best = 3 samples (request 0) leaves at once when 1 arrives.
    log, _ = run([0, 1, 30], DynamicBatcher(max_batch_size=8, preferred_batch_sizes=(4,),
                                            max_queue_delay_us=10_000),
                 service_ms=0.5, batch=[3, 2, 1])
    assert log == [launch(1, 0, [0]), launch(11, 0, [1]), launch(40, 0, [2])]


def _busy_then_five(delay_us):
    # Row 0 (3 samples = preferred) leaves at once and runs 10 ms; rows 1..5 queue meanwhile.
    policy = DynamicBatcher(max_batch_size=8, preferred_batch_sizes=(3,), max_queue_delay_us=delay_us)
    return run([0, 1, 2, 3, 4, 5], policy, service_ms=lambda s: 10 if s == 3 else 1,
               batch=[3, 1, 1, 1, 1, 1])[0]


def test_dynamic_before_the_delay_sends_exactly_the_preferred_size():
    # Rule 1 at 10 ms: the walk hits 3 (rows 1..3); the head has waited 9 ms < 50 ms.
    # Then [4, 5] (2 < 3 samples) wait for the delay from row 4 (4 ms + 50 ms).
    assert _busy_then_five(50_000) == [launch(0, 0, [0]), launch(10, 0, [1, 2, 3]), launch(54, 0, [4, 5])]


def test_dynamic_after_the_delay_a_batch_may_exceed_the_largest_preferred_size():
    # Rule 2 at 10 ms: the head has waited 9 ms >= 5 ms, so best is ignored and all five
    # walked requests leave, above the largest preferred size.
    assert _busy_then_five(5000) == [launch(0, 0, [0]), launch(10, 0, [1, 2, 3, 4, 5])]


def test_dynamic_cuts_the_batch_at_a_different_seq_len():
    # Rule 2 via a shape change: [0, 1] (seq 128) leave at once when row 2 (seq 256) arrives.
    log, _ = run([0, 1, 2, 50], DynamicBatcher(max_batch_size=8, max_queue_delay_us=10_000),
                 service_ms=0.5, seq_len=[128, 128, 256, 256])
    assert log == [launch(2, 0, [0, 1]), launch(12, 0, [2]), launch(60, 0, [3])]


def test_dynamic_with_zero_delay_sends_whatever_is_queued_when_an_instance_frees():
    log, _ = run([0, 0.1, 0.2, 0.3, 5], DynamicBatcher(max_batch_size=8, preferred_batch_sizes=(4,)),
                 service_ms=1.0)
    assert log == [launch(0, 0, [0]), launch(1, 0, [1, 2, 3]), launch(5, 0, [4])]


def test_dynamic_counts_samples_not_requests():
    # max_batch_size 4 samples: 2 + 2 fills it, the next request waits.
    log, _ = run([0, 0.1, 0.2], DynamicBatcher(max_batch_size=4, max_queue_delay_us=10_000),
                 service_ms=1.0, batch=[2, 2, 1])
    assert log == [launch(0.1, 0, [0, 1]), launch(10.2, 0, [2])]


def test_dynamic_each_idle_instance_takes_the_next_batch():
    log, _ = run([0, 0, 0, 0, 0], DynamicBatcher(max_batch_size=2), service_ms=1.0, instances=2)
    assert log == [launch(0, 0, [0, 1]), launch(0, 1, [2, 3]), launch(1, 0, [4])]


def test_dynamic_request_above_max_batch_size_is_bad_input():
    with pytest.raises(InputError, match="trace row 2: batch 9 exceeds max_batch_size 8"):
        run([0, 1], DynamicBatcher(max_batch_size=8), batch=[1, 9])


# --- dynamic: prefetch ------------------------------------------------------------------------

def test_prefetch_forms_batches_while_the_instance_is_busy():
    # Delay 0, preferred [2, 4]; row 0 runs alone for 10 ms. Without prefetch, at 10 ms the
    # walk over rows 1..5 finds best = 4. With prefetch, batches formed while the instance
    # was busy: [1, 2] saturated at preferred size 2, then [3, 4]; the queue of formed
    # batches is full (2 per instance), so row 5 waits for a slot.
    kwargs = dict(max_batch_size=8, preferred_batch_sizes=(2, 4))
    arrivals = [0, 0.5, 1, 2, 3, 4]
    cost = lambda s: 10 if s == 1 else 1  # noqa: E731
    without, _ = run(arrivals, DynamicBatcher(**kwargs), service_ms=cost)
    with_prefetch, _ = run(arrivals, DynamicBatcher(**kwargs, prefetch=True), service_ms=cost)
    assert without == [launch(0, 0, [0]), launch(10, 0, [1, 2, 3, 4]), launch(11, 0, [5])]
    assert with_prefetch == [launch(0, 0, [0]), launch(10, 0, [1, 2]), launch(11, 0, [3, 4]),
                             launch(12, 0, [5])]


def _prefetch_merge(delay_us):
    # Row 0 (2 samples) runs 10 ms. Meanwhile batch A = [1, 2] forms at preferred size 2 and
    # stays open (delay > 0), grows by row 3 past the largest preferred size and closes;
    # B = [4, 5] forms behind it (oldest request at 4 ms).
    policy = DynamicBatcher(max_batch_size=8, preferred_batch_sizes=(2,), max_queue_delay_us=delay_us,
                            prefetch=True)
    return run([0, 1, 2, 3, 4, 5], policy, service_ms=lambda s: 10 if s == 2 else 1,
               batch=[2, 1, 1, 1, 1, 1])[0]


def test_prefetch_merges_a_stale_formed_batch_into_the_one_taken():
    # At 10 ms B has waited 6 ms > 5 ms and fits: merged into A (InstanceQueue::Dequeue).
    assert _prefetch_merge(5000) == [launch(0, 0, [0]), launch(10, 0, [1, 2, 3, 4, 5])]


def test_prefetch_does_not_merge_a_batch_younger_than_the_delay():
    assert _prefetch_merge(7000) == [launch(0, 0, [0]), launch(10, 0, [1, 2, 3]), launch(11, 0, [4, 5])]


# --- dynamic: queue policies ----------------------------------------------------------------

def test_priority_level_one_is_served_first():
    policy = DynamicBatcher(max_batch_size=1, priority_levels=2, default_priority_level=2)
    log, _ = run([0, 1, 2, 3], policy, service_ms=10, priority=[0, 2, 0, 1])
    # [0] runs; at 10 ms rows 1 (level 2), 2 (level 2 by default) and 3 (level 1) wait.
    assert log == [launch(0, 0, [0]), launch(10, 0, [3]), launch(20, 0, [1]), launch(30, 0, [2])]


def test_a_batch_walks_across_priority_levels_in_order():
    policy = DynamicBatcher(max_batch_size=3, priority_levels=2)
    log, _ = run([0, 1, 2, 3, 4], policy, service_ms=10, priority=[1, 2, 2, 1, 1])
    assert log == [launch(0, 0, [0]), launch(10, 0, [3, 4, 1]), launch(20, 0, [2])]


def test_max_queue_size_rejects_arrivals_to_a_full_queue():
    policy = DynamicBatcher(max_batch_size=1, max_queue_size=2)
    log, result = run([0, 1, 2, 3, 4], policy, service_ms=10)
    # [0] runs at once; rows 1, 2 queue; rows 3, 4 find the queue full, at their arrival.
    assert ("launch", [0]) == (log[0][1], log[0][3])
    assert [entry for entry in log if entry[1] == "queue_full"] == [(3, "queue_full", -1, [3]),
                                                                     (4, "queue_full", -1, [4])]
    assert [e[3] for e in log if e[1] == "launch"] == [[0], [1], [2]]
    assert result.status.tolist() == [2, 2, 2, 3, 3]


def test_timeout_reject_answers_at_the_deadline():
    policy = DynamicBatcher(max_batch_size=1, default_timeout_us=3000, timeout_action="REJECT")
    log, result = run([0, 1, 2], policy, service_ms=10)
    # Rows 1 and 2 expire at 4 and 5 ms while [0] runs: each rejected at its deadline.
    assert log == [launch(0, 0, [0]), (4, "timeout", -1, [1]), (5, "timeout", -1, [2])]
    assert (result.end_ns[1:] == np.array([4, 5]) * 1_000_000).all()


def test_timeout_delay_moves_expired_requests_behind_the_others():
    policy = DynamicBatcher(max_batch_size=1, default_timeout_us=3000, timeout_action="DELAY")
    log, _ = run([0, 1, 9], policy, service_ms=10)
    # Row 1 expires at 4 ms and goes behind row 2 (unexpired at 10 ms).
    assert log == [launch(0, 0, [0]), launch(10, 0, [2]), launch(20, 0, [1])]


def test_request_timeout_overrides_the_default_only_when_allowed():
    strict = DynamicBatcher(max_batch_size=1, default_timeout_us=50_000)
    log, _ = run([0, 1], strict, service_ms=10, timeout_us=[0, 2000])
    assert [e[1] for e in log] == ["launch", "launch"]
    allowed = DynamicBatcher(max_batch_size=1, default_timeout_us=50_000, allow_timeout_override=True)
    log, _ = run([0, 1], allowed, service_ms=10, timeout_us=[0, 2000])
    assert log == [launch(0, 0, [0]), (3, "timeout", -1, [1])]


def test_preserve_ordering_holds_responses_until_earlier_ones_left():
    cost = lambda s: 10 if s == 2 else 1  # noqa: E731
    plain, r1 = run([0, 0, 0.5], DynamicBatcher(max_batch_size=2), service_ms=cost, instances=2)
    ordered, r2 = run([0, 0, 0.5], DynamicBatcher(max_batch_size=2, preserve_ordering=True),
                      service_ms=cost, instances=2)
    assert plain == ordered == [launch(0, 0, [0, 1]), launch(0.5, 1, [2])]
    assert r1.end_ns[2] == 1_500_000 and r2.end_ns[2] == 10_000_000


def test_request_timeout_counts_only_when_shorter_than_the_default():
    # scheduler_utils.cc PolicyQueue::Enqueue: override only if 0 < request < default.
    policy = DynamicBatcher(max_batch_size=1, default_timeout_us=2000, allow_timeout_override=True)
    log, _ = run([0, 1, 1.5], policy, service_ms=10, timeout_us=[0, 50_000, 1000])
    # Row 1 asks for 50 ms (longer): keeps the 2 ms default, expires at 3 ms; row 2 at 2.5 ms.
    assert log == [launch(0, 0, [0]), (2.5, "timeout", -1, [2]), (3, "timeout", -1, [1])]
    no_default = DynamicBatcher(max_batch_size=1, allow_timeout_override=True)
    log, _ = run([0, 1], no_default, service_ms=10, timeout_us=[0, 1000])
    assert [e[1] for e in log] == ["launch", "launch"]  # no default: requests' timeouts ignored


class _WakeCost(BatchCost):
    """1 ms per batch; 0.5 ms more when the batch wakes an idle serving loop."""

    wake_overhead_s = 0.0005

    def sample_s(self, samples, seq_len, rng):
        return 0.001


def test_a_batch_that_wakes_an_idle_loop_pays_the_wake_overhead():
    from schedsim.core.policy import Requests
    from schedsim.core.simulate import simulate
    from schedsim.traces.table import Trace

    # Row 0 wakes an idle loop (1.5 ms); row 1 queued meanwhile, so it starts at the very
    # instant row 0 finishes: the busy loop, 1 ms. Row 2 arrives after a gap: 1.5 ms again.
    req = Requests.from_trace(Trace.from_arrivals([0, 0.0002, 0.010]))
    result = simulate(req, NoBatching(), _WakeCost(), record=True)
    assert (result.batch_end_ns - result.batch_start_ns).tolist() == [1_500_000, 1_000_000, 1_500_000]


class _SharedGpuCost(BatchCost):
    """1 ms alone, 3 ms when two instances run at once (as a contention profile would say)."""

    def __init__(self, ms=1.0, contended=None):
        self.ms, self.contended = ms, contended

    def sample_s(self, samples, seq_len, rng):
        return self.ms / 1e3

    def at_concurrency(self, busy):
        return self.contended if busy >= 2 and self.contended else self


def test_batches_that_share_the_gpu_are_priced_by_the_contention_model():
    from schedsim.core.policy import Requests
    from schedsim.core.simulate import simulate
    from schedsim.traces.table import Trace

    # Rows 0 and 1 launch together on two instances: both 3 ms. Row 2 arrives when both are
    # idle again and runs alone: 1 ms.
    req = Requests.from_trace(Trace.from_arrivals([0, 0, 0.010]))
    result = simulate(req, NoBatching(), _SharedGpuCost(1.0, _SharedGpuCost(3.0)), instances=2)
    assert (result.batch_end_ns - result.batch_start_ns).tolist() == [3_000_000, 3_000_000, 1_000_000]


def test_static_sets_no_timer_while_every_instance_is_busy():
    """A timer with no idle instance could launch nothing (the next completion decides), so
    the policy asks for none: a live dispatcher would wake only to take host time."""
    from schedsim.core.policy import NEVER, Requests
    from schedsim.traces.table import Trace

    reqs = Requests.from_trace(Trace.from_arrivals(np.array([0.0, 0.0002, 0.0004])))
    policy = StaticBatching(batch_size=4, max_wait_us=1000)
    policy.reset(reqs, 1)
    policy.on_arrivals(400_000, 0, 3)
    busy = policy.decide(500_000, [])
    assert busy.launches == [] and busy.wake_at_ns == NEVER
    idle = policy.decide(500_000, [0])
    assert idle.launches == [] and idle.wake_at_ns == 1_000_000
