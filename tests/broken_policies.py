"""Users' policies that break the driver's contract, for the guard's tests (unit and CLI)."""

from __future__ import annotations

from schedsim.core.policy import Decision, Launch, Policy


class Spin(Policy):
    """Launches up to 8 when it can; otherwise asks again 1 ns later, forever."""

    def reset(self, requests, instances):
        super().reset(requests, instances)
        self.queue = []

    def on_arrivals(self, now_ns, first, stop):
        self.queue.extend(range(first, stop))

    def decide(self, now_ns, idle):
        if idle and self.queue:
            rows, self.queue = self.queue[:8], self.queue[8:]
            return Decision(launches=[Launch(idle[0], rows)], wake_at_ns=now_ns + 1)
        return Decision(wake_at_ns=now_ns + 1)


class Never(Policy):
    def decide(self, now_ns, idle):
        return Decision()


class Same(Policy):
    def decide(self, now_ns, idle):
        return Decision(wake_at_ns=now_ns)


class NotADecision(Policy):
    def decide(self, now_ns, idle):
        return None


class Raises(Policy):
    def decide(self, now_ns, idle):
        return 1 / 0
