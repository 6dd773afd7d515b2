"""The event core: a heap of events keyed by (time, priority, sequence number).

This is simpy's core reduced to what the drivers use (as Vidur owns its heapq loop):
:class:`EventLoop` pops the earliest :class:`Event` and calls its callback; ``at`` (an
absolute time) and :func:`Scheduled` (a delay from now) put one on the heap. Every event
carries one of the priorities below, so at one instant the order is always:

1. completions (:data:`COMPLETION`): an instance that finishes at t is free for a batch
   formed at t;
2. arrivals (:data:`ARRIVAL`): a fleet routes each request at its arrival time, after the
   completions of that instant (a single driver delivers arrivals inside its decisions);
3. decisions (:data:`DECISION`): the policy decides once, after everything that happened
   at t. A single driver delivers the requests that have arrived by then first, so a
   request that arrives at t can join a batch formed at t, and waking up for an arrival
   is a decision event at the arrival time.

The sequence number keeps events of equal time and priority in scheduling order, which
makes runs deterministic. Time is an integer number of nanoseconds, so ties are exact:
a request that arrives exactly when the queue delay expires is seen by that decision.

Why not simpy: its public API (``Environment.schedule(event, priority, delay)``, ``peek``,
``step``, ``run``) only processes events that have been triggered, and the only public
ways to trigger one (``Timeout``, ``Event.succeed``) fix the priority; an event of a
chosen priority must write ``Event._ok`` and ``_value``. benchmarks/bench_event_core.py
measures this loop against simpy's on a whole run.
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count
from typing import Callable

COMPLETION = 0
"""Priority of a batch's or a step's end."""
ARRIVAL = 1
"""Priority of routing an arrival (a fleet) and of an autoscaler's look at the fleet."""
DECISION = 2
"""Priority of asking the policy, once, after everything else at that instant."""

NO_EVENT = float("inf")
"""What :meth:`EventLoop.peek` returns when no event is scheduled (later than any time)."""


class Event:
    """One scheduled callback: ``callback(event)`` runs at ``at`` with ``value`` at hand, so a
    callback needs no call to the loop."""

    __slots__ = ("at", "callback", "value")

    def __init__(self, at: int, callback: Callable[["Event"], None], value=None):
        self.at, self.callback, self.value = at, callback, value


class EventLoop:
    """A discrete-event loop on integer nanoseconds: ``now``, ``at()``, ``peek()``, ``step()``, ``run()``.

    ``now`` is the time of the event being processed. A driver that runs the next event
    itself, without putting it on the heap (it is due before :meth:`peek`, so the loop
    would process it next anyway), schedules later events by absolute time with
    :meth:`at`, which does not depend on ``now``.
    """

    __slots__ = ("now", "heap", "_seq")

    def __init__(self):
        self.now = 0
        self.heap: list[tuple] = []
        """(time_ns, priority, sequence number, event): heapq's order is the documented order."""
        self._seq = count()

    def at(self, time_ns: int, priority: int, callback: Callable[[Event], None], value=None) -> Event:
        """Schedule ``callback(event)`` at the absolute time ``time_ns`` (not before ``now``)."""
        if time_ns < self.now:
            raise ValueError(f"event at {time_ns} ns scheduled at {self.now} ns, in the past")
        event = Event(time_ns, callback, value)
        heappush(self.heap, (time_ns, priority, next(self._seq), event))
        return event

    def peek(self) -> int | float:
        """The time of the next event; :data:`NO_EVENT` when there is none."""
        heap = self.heap
        return heap[0][0] if heap else NO_EVENT

    def step(self) -> None:
        """Process the next event (IndexError when there is none)."""
        self.now, _, _, event = heappop(self.heap)
        event.callback(event)

    def run(self) -> None:
        """Process events until none is left."""
        heap = self.heap
        while heap:
            self.now, _, _, event = heappop(heap)
            event.callback(event)


def Scheduled(loop: EventLoop, delay_ns: int, priority: int, callback: Callable[[Event], None],  # noqa: N802
              value=None) -> Event:
    """Schedule ``callback(event)`` ``delay_ns`` after ``loop.now`` (see :meth:`EventLoop.at`)."""
    if delay_ns < 0:
        raise ValueError(f"negative delay {delay_ns} ns")
    return loop.at(loop.now + delay_ns, priority, callback, value)
