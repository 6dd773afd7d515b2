"""Routers: which replica of a fleet takes each request. ``ROUTERS`` maps ``--router`` names.

A router is a pure decision object, like a policy: it is told when requests are routed,
start and finish, and answers one question, "which replica takes this request?". It
never reads a clock or looks inside a replica. A user's own router subclasses
:class:`Router` and is loaded with ``--router path/file.py:MyRouter`` or ``module:MyRouter``.

Hooks, called by the fleet driver (:mod:`schedsim.planning.fleet`):

``reset(requests, replicas)``
    once, before the run: the read-only request columns and the number of replicas.
``route(now_ns, row, active) -> int``
    request ``row`` arrives now; return one of ``active`` (routable replicas, lowest
    first; an autoscaler may change the list). Completions at ``now_ns`` come first.
``on_start(now_ns, replica, count)``
    ``count`` requests of ``replica`` started running in one batch.
``on_done(now_ns, replica, count)``
    ``count`` requests of ``replica`` finished.

The base class keeps ``queued[r]`` (routed, not started) and ``outstanding[r]`` (routed,
not finished) up to date; ties go to the lowest replica index, so runs repeat exactly.
"""

from __future__ import annotations

import numpy as np


class Router:
    name = "router"

    def reset(self, requests, replicas: int) -> None:
        self.requests = requests
        self.replicas = replicas
        self.queued = np.zeros(replicas, dtype=np.int64)
        self.outstanding = np.zeros(replicas, dtype=np.int64)

    def route(self, now_ns: int, row: int, active: list[int]) -> int:
        replica = self.choose(now_ns, row, active)
        self.queued[replica] += 1
        self.outstanding[replica] += 1
        return replica

    def choose(self, now_ns: int, row: int, active: list[int]) -> int:
        raise NotImplementedError

    def on_start(self, now_ns: int, replica: int, count: int) -> None:
        self.queued[replica] -= count

    def on_done(self, now_ns: int, replica: int, count: int) -> None:
        self.outstanding[replica] -= count


class RoundRobin(Router):
    """Each active replica in turn."""

    name = "round-robin"
    stateless = True
    """Routes without looking at replica state (the fleet can skip its search pass)."""

    def reset(self, requests, replicas: int) -> None:
        super().reset(requests, replicas)
        self._next = 0

    def choose(self, now_ns: int, row: int, active: list[int]) -> int:
        # The first active replica at or after the pointer, so a fleet that grows or shrinks
        # keeps cycling instead of restarting at replica 0.
        for r in active:
            if r >= self._next:
                break
        else:
            r = active[0]
        self._next = r + 1
        return r


class _Fewest(Router):
    def _fewest(self, counts: np.ndarray, active: list[int]) -> int:
        best = active[0]
        for r in active[1:]:
            if counts[r] < counts[best]:
                best = r
        return best


class LeastOutstanding(_Fewest):
    """The replica with the fewest requests routed to it and not yet finished (queued or running)."""

    name = "least-outstanding"

    def choose(self, now_ns: int, row: int, active: list[int]) -> int:
        return self._fewest(self.outstanding, active)


class JoinShortestQueue(_Fewest):
    """The replica with the fewest requests waiting (routed, not yet started)."""

    name = "jsq"

    def choose(self, now_ns: int, row: int, active: list[int]) -> int:
        return self._fewest(self.queued, active)


ROUTERS = {
    "round-robin": RoundRobin, "rr": RoundRobin,
    "least-outstanding": LeastOutstanding, "lor": LeastOutstanding,
    "jsq": JoinShortestQueue, "join-shortest-queue": JoinShortestQueue,
}
