"""The event core: simultaneous events in the documented order, enforced by the heap key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from golden import run
from policies import NoBatching
from schedsim.core.events import ARRIVAL, COMPLETION, DECISION, NO_EVENT, EventLoop, Scheduled


def test_at_one_instant_completions_come_before_arrivals_before_decisions():
    loop, log = EventLoop(), []
    record = lambda event: log.append((loop.now, event.value))  # noqa: E731
    # Scheduled in the reverse of the order they must run in.
    Scheduled(loop, 5, DECISION, record, "decision")
    Scheduled(loop, 5, ARRIVAL, record, "arrival")
    Scheduled(loop, 5, COMPLETION, record, "completion")
    Scheduled(loop, 3, DECISION, record, "earlier decision")
    loop.run()
    assert log == [(3, "earlier decision"), (5, "completion"), (5, "arrival"), (5, "decision")]


def test_events_of_one_time_and_priority_run_in_the_order_they_were_scheduled():
    loop, log = EventLoop(), []
    for k in range(5):
        loop.at(7, COMPLETION, lambda event: log.append(event.value), k)
    loop.run()
    assert log == [0, 1, 2, 3, 4]


def test_an_event_scheduled_during_an_instant_still_takes_its_place_in_it():
    loop, log = EventLoop(), []

    def completion(event):
        log.append("completion")
        Scheduled(loop, 0, COMPLETION, lambda e: log.append("second completion"))

    loop.at(4, DECISION, lambda e: log.append("decision"))
    loop.at(4, COMPLETION, completion)
    loop.run()
    assert log == ["completion", "second completion", "decision"]


def test_peek_step_and_now():
    loop = EventLoop()
    assert loop.peek() == NO_EVENT and loop.now == 0
    event = loop.at(10, DECISION, lambda e: None, "v")
    assert (event.at, event.value, loop.peek()) == (10, "v", 10)
    loop.step()
    assert loop.now == 10 and loop.peek() == NO_EVENT
    with pytest.raises(IndexError):
        loop.step()


def test_the_past_is_refused():
    loop = EventLoop()
    loop.at(10, DECISION, lambda e: None)
    loop.run()
    with pytest.raises(ValueError, match="in the past"):
        loop.at(9, DECISION, lambda e: None)
    with pytest.raises(ValueError, match="negative delay"):
        Scheduled(loop, -1, DECISION, lambda e: None)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([COMPLETION, ARRIVAL, DECISION])), max_size=40))
def test_events_pop_in_key_order_whatever_the_scheduling_order(events):
    loop, log = EventLoop(), []
    for k, (t, priority) in enumerate(events):
        loop.at(t, priority, lambda event: log.append(event.value), (t, priority, k))
    loop.run()
    assert log == sorted(log)


def test_a_request_arriving_as_a_batch_ends_is_served_at_that_instant():
    # Row 0 runs 0-1 ms; row 1 arrives at 1 ms exactly: the completion comes first, so the
    # decision at 1 ms sees a free instance and the new request.
    log, _ = run([0, 1], NoBatching(), service_ms=1.0)
    assert log == [(0, "launch", 0, [0]), (1, "launch", 0, [1])]
