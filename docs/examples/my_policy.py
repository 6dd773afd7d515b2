"""A size-or-timeout batcher: the worked example of a user's own policy.

Send a batch when ``batch_size`` requests are waiting, or when the oldest waiting
request has waited ``timeout_us``, whichever comes first, on the lowest idle
instance. Pure: it never reads a clock, never sleeps and imports neither simpy nor
an engine; the driver tells it the time.

    schedsim run trace.csv --policy docs/examples/my_policy.py:MyPolicy \
        --param batch_size=16 --param timeout_us=800
"""

from collections import deque

import numpy as np

from schedsim.errors import InputError
from schedsim.core.policy import NEVER, Decision, Launch, Policy


class MyPolicy(Policy):
    """Batches of up to ``batch_size`` requests; a partial batch leaves after ``timeout_us``."""

    name = "size-or-timeout"

    def __init__(self, batch_size: int = 8, timeout_us: int = 500):
        # InputError: the CLI prints it as one line, exit status 2.
        if int(batch_size) < 1:
            raise InputError(f"batch_size: {batch_size!r} is not valid; expected an integer >= 1")
        if int(timeout_us) < 0:
            raise InputError(f"timeout_us: {timeout_us!r} is not valid; expected an integer >= 0")
        self.batch_size = int(batch_size)
        self.timeout_ns = int(timeout_us) * 1000

    def reset(self, requests, instances):
        super().reset(requests, instances)  # keeps self.requests and self.instances
        self._queue = deque()               # request rows, oldest first

    def max_batch_samples(self):
        # Lets `schedsim run` check that the profile covers every batch we may launch.
        return self.batch_size * int(self.requests.samples.max(initial=1))

    def on_arrivals(self, now_ns, first, stop):
        self._queue.extend(range(first, stop))

    def decide(self, now_ns, idle):
        arrival_ns = self.requests.arrival_ns
        idle = list(idle)
        launches = []
        while idle and self._queue:
            full = len(self._queue) >= self.batch_size
            late = now_ns - int(arrival_ns[self._queue[0]]) >= self.timeout_ns
            if not (full or late):
                break
            k = min(self.batch_size, len(self._queue))
            rows = np.array([self._queue.popleft() for _ in range(k)], dtype=np.int64)
            launches.append(Launch(idle.pop(0), rows))
        wake = NEVER
        if self._queue:
            deadline = int(arrival_ns[self._queue[0]]) + self.timeout_ns
            # A deadline already passed means every instance is busy: the next
            # completion wakes us, so no timer (wake_at_ns must lie in the future).
            if deadline > now_ns:
                wake = deadline
        # With no idle instance an arrival cannot change the answer, so let the
        # driver hand arrivals over in bulk at the next completion or timer.
        return Decision(launches, wake_at_ns=wake, wake_on_arrival=bool(idle))
