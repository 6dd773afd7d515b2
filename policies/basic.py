"""Request-level baselines: ``none`` (one request per batch) and ``static`` (fixed size).

Neither drops requests, so the queue is always the consecutive rows [head, tail).
"""

from __future__ import annotations

import numpy as np

from schedsim.errors import InputError
from schedsim.core.policy import NEVER, Decision, Launch, Policy, Requests


class NoBatching(Policy):
    """One request per batch, started as soon as an instance is free, in arrival order."""

    name = "none"

    def reset(self, requests: Requests, instances: int) -> None:
        super().reset(requests, instances)
        self._head = self._tail = 0

    def max_batch_samples(self) -> int:
        return int(self.requests.samples.max()) if hasattr(self, "requests") and len(self.requests) else 1

    def on_arrivals(self, now_ns: int, first: int, stop: int) -> None:
        self._tail = stop

    def decide(self, now_ns: int, idle: list[int]) -> Decision:
        take = min(len(idle), self._tail - self._head)
        launches = [Launch(inst, range(self._head + i, self._head + i + 1)) for i, inst in enumerate(idle[:take])]
        self._head += take
        return Decision(launches, wake_on_arrival=len(idle) > take)

    def queue_rule(self):
        def rule(now_ns: int, head: int, tail: int) -> tuple[int, int, int]:
            """NoBatching's decision on one idle instance (Policy.queue_rule)."""
            return (1 if tail > head else 0), NEVER, 1
        # The dynamic batcher's rule with max_batch_size 1 and no queue delay decides the same
        # (schedsim.core.compiled_queue runs it compiled).
        rule.compiled_as = ("dynamic", (1,), 0, 1)
        return rule


class StaticBatching(Policy):
    """Fixed batches of ``batch_size`` requests.

    A batch leaves when ``batch_size`` requests are queued and an instance is idle; the
    remainder leaves at the end of the trace, or once its oldest request has waited
    ``max_wait_us`` (0 = wait for a full batch).
    """

    name = "static"

    def __init__(self, batch_size: int = 8, max_wait_us: int = 0):
        if int(batch_size) < 1:
            raise InputError(f"batch_size: {batch_size!r} is not valid; expected an integer >= 1")
        if int(max_wait_us) < 0:
            raise InputError(f"max_wait_us: {max_wait_us!r} is not valid; expected an integer >= 0")
        self.batch_size = int(batch_size)
        self.max_wait_ns = int(max_wait_us) * 1000

    def max_batch_samples(self) -> int:
        if hasattr(self, "requests") and len(self.requests):
            # Largest sum of batch_size consecutive requests' samples.
            s = np.concatenate([[0], np.cumsum(self.requests.samples, dtype=np.int64)])
            k = min(self.batch_size, len(self.requests))
            return int((s[k:] - s[:-k]).max())
        return self.batch_size

    def reset(self, requests: Requests, instances: int) -> None:
        super().reset(requests, instances)
        self._head = self._tail = 0
        self._ended = False

    def on_arrivals(self, now_ns: int, first: int, stop: int) -> None:
        self._tail = stop

    def on_trace_end(self, now_ns: int) -> None:
        self._ended = True

    def decide(self, now_ns: int, idle: list[int]) -> Decision:
        launches, idle = [], list(idle)
        arrival = self.requests.arrival_ns
        while idle and self._tail > self._head:
            queued = self._tail - self._head
            late = self.max_wait_ns and now_ns - int(arrival[self._head]) >= self.max_wait_ns
            if not (queued >= self.batch_size or late or self._ended):
                break
            take = min(self.batch_size, queued)
            launches.append(Launch(idle.pop(0), range(self._head, self._head + take)))
            self._head += take
        queued = self._tail - self._head
        wake = NEVER
        if queued and self.max_wait_ns and idle:
            # Only with an idle instance: while every instance is busy a timer could launch
            # nothing, and the next completion decides anyway (a live dispatcher woken for
            # nothing takes host time from the engine's thread).
            wake = int(arrival[self._head]) + self.max_wait_ns
            wake = wake if wake > now_ns else NEVER
        # With a max wait, the next arrival may start the head's clock; else only a full batch matters.
        need = max(self.batch_size - queued, 1) if queued or not self.max_wait_ns else 1
        return Decision(launches, wake_at_ns=wake, wake_on_arrival=bool(idle), arrivals_needed=need)

    def queue_rule(self):
        """``decide`` on one idle instance as a function of the queue [head, tail)."""
        size, max_wait, n, arrival = self.batch_size, self.max_wait_ns, len(self.requests), self.requests.arrival_ns

        def rule(now_ns: int, head: int, tail: int) -> tuple[int, int, int]:
            queued = tail - head
            if queued:
                if queued >= size or tail == n or (max_wait and now_ns - arrival.item(head) >= max_wait):
                    return min(size, queued), NEVER, 1
                if max_wait:
                    wake = arrival.item(head) + max_wait
                    return 0, (wake if wake > now_ns else NEVER), max(size - queued, 1)
                return 0, NEVER, max(size - queued, 1)
            return 0, NEVER, 1 if max_wait else size  # with a max wait, the next arrival starts a clock
        rule.compiled_as = ("static", size, max_wait)  # schedsim.core.compiled_queue
        return rule
