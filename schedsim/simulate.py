"""The simpy driver: turns a policy's decisions into timeouts.

Arrivals are not events while every instance is busy: requests sit in the trace's
sorted arrays and are handed to the policy in bulk at the next event, so a busy
server costs one event per batch, not per request. When the policy says an arrival
may change its answer (``Decision.wake_on_arrival``), the driver wakes at the next
arrival time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from schedsim.events import COMPLETION, DECISION, Scheduled
from schedsim.policy import NEVER, Decision, Policy, Requests

# Per-request status codes (the ``status`` column).
QUEUED, RUNNING, COMPLETED, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT, FAILED = range(6)
STATUS_NAMES = ("unfinished", "running", "completed", "rejected_queue_full", "rejected_timeout",
                "failed")
_REJECT_STATUS = {"queue_full": REJECTED_QUEUE_FULL, "timeout": REJECTED_TIMEOUT}


class PolicyError(RuntimeError):
    """A policy broke the driver's contract (a bug in the policy, not bad input)."""


@dataclass(eq=False)
class SimResult:
    """The per-request table (row = request, units in names) and the batch log."""

    requests: Requests
    start_ns: np.ndarray
    end_ns: np.ndarray
    """Response time: completion, delayed by preserve_ordering when the policy asks for it."""
    batch_size: np.ndarray
    """Samples in the batch the request ran in (0 if it did not run)."""
    instance: np.ndarray
    status: np.ndarray
    batch_start_ns: np.ndarray
    batch_end_ns: np.ndarray
    batch_instance: np.ndarray
    batch_samples: np.ndarray
    batch_requests: np.ndarray
    instances: int
    seed: int
    decisions: list | None = None
    """With ``record=True``: (time_ns, "launch"|reason, instance, rows) in decision order."""
    meta: dict = field(default_factory=dict)


def simulate(requests: Requests, policy: Policy, cost, *, instances: int = 1, seed: int = 0,
             record: bool = False) -> SimResult:
    """Replay ``requests`` against ``policy`` on ``instances`` servers costed by ``cost``."""
    return _Driver(requests, policy, cost, instances, seed, record).run()


class _Driver:
    def __init__(self, requests: Requests, policy: Policy, cost, instances: int, seed: int,
                 record: bool):
        if instances < 1:
            raise ValueError("instances must be >= 1")
        n = len(requests)
        self.req, self.policy, self.cost = requests, policy, cost
        self.instances, self.seed = instances, seed
        self.rng = np.random.default_rng(seed)
        self.env = simpy.Environment()
        self.arrival_ns = requests.arrival_ns
        self.start_ns = np.full(n, -1, dtype=np.int64)
        self.done_ns = np.full(n, -1, dtype=np.int64)
        self.batch_size = np.zeros(n, dtype=np.int32)
        self.instance = np.full(n, -1, dtype=np.int16)
        self.status = np.zeros(n, dtype=np.int8)
        self.batches: list[tuple] = []
        self.idle = list(range(instances))
        self.delivered = 0          # rows [0, delivered) have been handed to the policy
        self.ended = False
        self.decision_pending = False
        self.arrival_pending = False
        self.dirty = True           # something happened since the policy last decided
        self.timer_at = NEVER
        self.decisions = [] if record else None
        self.keep_order = bool(getattr(policy, "preserve_ordering", False))
        self.dispatch_order: list[np.ndarray] = []

    def run(self) -> SimResult:
        self.policy.reset(self.req, self.instances)
        if len(self.req):
            self._schedule_arrival()
        else:
            self._request_decision()
        self.env.run()
        return self._result()

    # --- events ----------------------------------------------------------------------------

    def _schedule_arrival(self) -> None:
        if self.arrival_pending or self.delivered >= len(self.req):
            return
        self.arrival_pending = True
        delay = int(self.arrival_ns[self.delivered]) - self.env.now
        # Arrivals are delivered by the decision itself, so waking for one is a decision
        # event at the arrival time (after any completion at that instant).
        Scheduled(self.env, max(delay, 0), DECISION, self._on_arrival)

    def _on_arrival(self, event) -> None:
        self.arrival_pending = False
        self._on_decision(event)

    def _on_completion(self, event) -> None:
        instance, rows = event.value
        now = self.env.now
        self.done_ns[rows] = now
        self.status[rows] = COMPLETED
        self.idle.append(instance)
        self.idle.sort()
        self.policy.on_batch_done(now, instance, rows)
        self.dirty = True
        self._request_decision()

    def _on_timer(self, event) -> None:
        if event.value == self.timer_at:  # a later decision may have moved the timer
            self.timer_at = NEVER
            self.dirty = True
            self._request_decision()

    def _request_decision(self) -> None:
        if not self.decision_pending:
            self.decision_pending = True
            Scheduled(self.env, 0, DECISION, self._on_decision)

    def _on_decision(self, _event) -> None:
        self.decision_pending = False
        now = self.env.now
        self._deliver(now)
        if not self.dirty:
            return  # a second wake-up at this instant with nothing new to decide on
        self.dirty = False
        decision = self.policy.decide(now, list(self.idle))
        if not isinstance(decision, Decision):
            raise PolicyError(f"{type(self.policy).__name__}.decide returned {decision!r}, not a Decision")
        for reject in decision.rejects:
            self._reject(now, reject)
        for launch in decision.launches:
            self._launch(now, launch)
        wake = decision.wake_at_ns
        if wake < NEVER:
            if wake <= now:
                raise PolicyError(f"{type(self.policy).__name__} asked to wake at {wake} ns, "
                                  f"not after now ({now} ns)")
            if wake != self.timer_at:
                self.timer_at = wake
                Scheduled(self.env, wake - now, DECISION, self._on_timer, wake)
        if decision.wake_on_arrival:
            self._schedule_arrival()

    def _deliver(self, now: int) -> None:
        n = len(self.req)
        if self.delivered < n and self.arrival_ns[self.delivered] <= now:
            stop = int(np.searchsorted(self.arrival_ns, now, side="right"))
            first, self.delivered = self.delivered, stop
            self.policy.on_arrivals(now, first, stop)
            self.dirty = True
        if self.delivered == n and not self.ended:
            self.ended = True
            self.policy.on_trace_end(now)
            self.dirty = True

    # --- applying decisions --------------------------------------------------------------

    def _launch(self, now: int, launch) -> None:
        instance, rows = launch.instance, np.asarray(launch.rows, dtype=np.int64)
        name = type(self.policy).__name__
        if instance not in self.idle:
            raise PolicyError(f"{name} launched a batch on instance {instance}, which is not idle")
        if rows.size == 0:
            raise PolicyError(f"{name} launched an empty batch")
        if (rows >= self.delivered).any() or (self.status[rows] != QUEUED).any():
            raise PolicyError(f"{name} launched rows that are not queued: {rows[:8].tolist()}")
        self.idle.remove(instance)
        samples = int(self.req.samples[rows].sum())
        seq_len = int(self.req.seq_len[rows].max())  # mixed lengths run padded to the longest
        service_ns = int(round(self.cost.sample_s(samples, seq_len, self.rng) * 1e9))
        self.start_ns[rows] = now
        self.batch_size[rows] = samples
        self.instance[rows] = instance
        self.status[rows] = RUNNING
        self.batches.append((now, now + service_ns, instance, samples, rows.size))
        if self.keep_order:
            self.dispatch_order.append(rows)
        if self.decisions is not None:
            self.decisions.append((now, "launch", instance, tuple(int(r) for r in rows)))
        Scheduled(self.env, service_ns, COMPLETION, self._on_completion, (instance, rows))

    def _reject(self, now: int, reject) -> None:
        rows = np.asarray(reject.rows, dtype=np.int64)
        if (self.status[rows] != QUEUED).any():
            raise PolicyError(f"{type(self.policy).__name__} rejected rows that are not queued")
        self.status[rows] = _REJECT_STATUS.get(reject.reason, REJECTED_QUEUE_FULL)
        self.done_ns[rows] = now
        if self.decisions is not None:
            self.decisions.append((now, reject.reason, -1, tuple(int(r) for r in rows)))

    def _result(self) -> SimResult:
        end = self.done_ns
        if self.keep_order and self.dispatch_order:
            # A response waits for every response dispatched before it (Triton's completion queue).
            order = np.concatenate(self.dispatch_order)
            done = order[self.status[order] == COMPLETED]
            end = end.copy()
            end[done] = np.maximum.accumulate(end[done])
        b = np.array(self.batches, dtype=np.int64).reshape(-1, 5)
        return SimResult(self.req, self.start_ns, end, self.batch_size, self.instance, self.status,
                         b[:, 0].copy(), b[:, 1].copy(), b[:, 2].astype(np.int16),
                         b[:, 3].astype(np.int32), b[:, 4].astype(np.int32),
                         self.instances, self.seed, self.decisions)
