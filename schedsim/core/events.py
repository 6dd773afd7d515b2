"""The event core: simpy's heap, with a fixed order for simultaneous events.

simpy orders its heap by ``(time, priority, sequence number)``. schedsim schedules every
event with one of the two priorities below, so at one instant the order is always:

1. completions   (an instance that finishes at t is free for a batch formed at t)
2. decisions     (the policy decides once, after everything that happened at t)

Arrivals are not events of their own: every decision first delivers the requests that
have arrived by its time, so a request that arrives at t can join a batch formed at t,
and waking up for an arrival is a decision event at the arrival time.

The sequence number keeps events of equal time and priority in scheduling order, which
makes runs deterministic. Time is an integer number of nanoseconds, so ties are exact:
a request that arrives exactly when the queue delay expires is seen by that decision.
"""

from __future__ import annotations

from heapq import heappush
from typing import Callable

import simpy
from simpy.events import Event

COMPLETION = 0
DECISION = 1


class Scheduled(Event):
    """An event that fires ``callback(event)`` after ``delay_ns`` with a fixed priority.

    This is what :class:`simpy.Timeout` does, with the priority made explicit. ``at`` is
    the time it fires, so a callback needs no call to ``env.now``.
    """

    def __init__(self, env: simpy.Environment, delay_ns: int, priority: int,
                 callback: Callable[[Event], None], value=None):
        if delay_ns < 0:
            raise ValueError(f"negative delay {delay_ns} ns")
        self.env = env
        self.callbacks = [callback]
        self._value = value
        self._ok = True
        self.at = env._now + delay_ns
        # What env.schedule does, inline (one Python call less per event, a few percent of
        # a run): simpy's heap holds (time, priority, sequence number, event).
        heappush(env._queue, (self.at, priority, next(env._eid), self))
