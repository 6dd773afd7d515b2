"""The simpy driver: turns a policy's decisions into timeouts.

Arrivals are not events while every instance is busy: requests sit in the trace's
sorted arrays and are handed to the policy in bulk at the next event, so a busy
server costs one event per batch, not per request. When the policy says arrivals may
change its answer (``Decision.wake_on_arrival``), the driver wakes at the arrival it
named (``arrivals_needed``). A decision runs inline at the end of an event when no
other event is due at the same instant; otherwise it is scheduled behind them.
"""

from __future__ import annotations

import numpy as np
import simpy

from schedsim.events import COMPLETION, DECISION, Scheduled
from schedsim.policy import NEVER, Policy, Requests

from schedsim.results import (ask, COMPLETED, QUEUED, REJECT_STATUS, REJECTED_QUEUE_FULL, RUNNING,
                              PolicyError, SimResult)


def simulate(requests: Requests, policy: Policy, cost, *, instances: int = 1, seed: int = 0,
             record: bool = False) -> SimResult:
    """Replay ``requests`` against ``policy`` on ``instances`` servers costed by ``cost``."""
    return _Driver(requests, policy, cost, instances, seed, record).run()


class _Driver:
    def __init__(self, requests: Requests, policy: Policy, cost, instances: int, seed: int,
                 record: bool, env: simpy.Environment | None = None):
        if instances < 1:
            raise ValueError("instances must be >= 1")
        n = len(requests)
        self.req, self.policy, self.cost = requests, policy, cost
        self.instances, self.seed = instances, seed
        self.rng = np.random.default_rng(seed)
        # A fleet (schedsim/fleet.py) runs several drivers, one per replica, on one shared env.
        self.env = env if env is not None else simpy.Environment()
        self.arrival_ns = requests.arrival_ns
        self.n = n
        # Samples of rows [a, b) = cum[b] - cum[a]: O(1) for a consecutive batch.
        self.cum_samples = np.concatenate([[0], np.cumsum(requests.samples, dtype=np.int64)])
        self.one_sample_each = bool(n and self.cum_samples[-1] == n)
        seq = requests.seq_len
        self.one_seq_len = int(seq[0]) if n and (seq == seq[0]).all() else None
        self.start_ns = np.full(n, -1, dtype=np.int64)
        self.done_ns = np.full(n, -1, dtype=np.int64)
        self.batch_size = np.zeros(n, dtype=np.int32)
        self.instance = np.full(n, -1, dtype=np.int16)
        self.status = np.zeros(n, dtype=np.int8)
        self.batches: list[tuple] = []   # (start_ns, end_ns, instance, samples, requests)
        self.batch_rows: list = []       # the rows of each batch: range or int array
        self.idle = list(range(instances))
        # When each instance last finished a batch: a launch at that same instant is the busy
        # serving loop; any later one first wakes an idle loop and pays the cost's wake overhead.
        self.freed_at = [-1] * instances
        self.wake_ns = int(round(getattr(cost, "wake_overhead_s", 0.0) * 1e9))
        self.concurrency_aware = instances > 1 and hasattr(cost, "at_concurrency")
        self.delivered = 0          # rows [0, delivered) have been handed to the policy
        self.next_arrival_ns = int(self.arrival_ns[0]) if n else NEVER  # of row `delivered`
        self.decision_pending = False
        self.dirty = True           # something happened since the policy last decided
        self.arrival_wake = -1      # row whose arrival an event is scheduled for
        self.timer_at = NEVER
        self.decisions = [] if record else None
        self.keep_order = bool(getattr(policy, "preserve_ordering", False))
        # Skip the call for policies that do not override the no-op hook (most of them).
        self.tells_batch_done = getattr(type(policy), "on_batch_done", None) is not Policy.on_batch_done

    def run(self) -> SimResult:
        self.policy.reset(self.req, self.instances)
        if self.n:
            self._wake_at_arrival(0)
        else:
            self.policy.on_trace_end(0)
            self._decide_now(0)
        self.env.run()
        return self._result()

    # --- events ----------------------------------------------------------------------------

    def _wake_at_arrival(self, row: int) -> None:
        row = min(row, self.n - 1)  # the last arrival also ends the trace: always worth a wake-up
        if row < self.delivered or row == self.arrival_wake:
            return
        self.arrival_wake = row
        # Arrivals are delivered by the decision itself, so waking for one is a decision
        # event at the arrival time (after any completion at that instant).
        Scheduled(self.env, max(int(self.arrival_ns[row]) - self.env.now, 0), DECISION,
                  self._on_decision_event)

    def _on_completion(self, event) -> None:
        instance, rows = event.value
        now = self.env.now
        self.freed_at[instance] = now
        self.idle.append(instance)
        if len(self.idle) > 1:
            self.idle.sort()
        if self.tells_batch_done:
            self.policy.on_batch_done(now, instance, rows)
        self.dirty = True
        if self.env.peek() > now:
            self._decide_now(now)  # nothing else happens at this instant: decide inline
        elif not self.decision_pending:
            self.decision_pending = True
            Scheduled(self.env, 0, DECISION, self._on_decision_event)

    def _on_timer(self, event) -> None:
        if event.value == self.timer_at:  # a later decision may have moved the timer
            self.timer_at = NEVER
            self.dirty = True
            self._on_decision_event(event)

    def _on_decision_event(self, _event) -> None:
        self.decision_pending = False
        self._decide_now(self.env.now)

    def _decide_now(self, now: int) -> None:
        if self.next_arrival_ns <= now:
            self._deliver(now)
        if not self.dirty:
            return  # a second wake-up at this instant with nothing new to decide on
        self.dirty = False
        decision = ask(self.policy, now, list(self.idle))
        for reject in decision.rejects:
            self._reject(now, reject)
        # Batches launched together run together: each sees the others in its concurrency.
        self.busy_after = self.instances - len(self.idle) + len(decision.launches)
        for launch in decision.launches:
            self._launch(now, launch)
        wake = decision.wake_at_ns
        if wake < NEVER and wake != self.timer_at:
            self.timer_at = wake
            Scheduled(self.env, wake - now, DECISION, self._on_timer, wake)
        if decision.wake_on_arrival:
            self._wake_at_arrival(self.delivered + max(int(decision.arrivals_needed), 1) - 1)

    def _deliver(self, now: int) -> None:
        if self.next_arrival_ns <= now:
            stop = int(self.arrival_ns.searchsorted(now, side="right"))
            first, self.delivered = self.delivered, stop
            self.next_arrival_ns = int(self.arrival_ns[stop]) if stop < self.n else NEVER
            self.policy.on_arrivals(now, first, stop)
            self.dirty = True
            if stop == self.n:
                self.policy.on_trace_end(now)

    # --- applying decisions --------------------------------------------------------------

    def _launch(self, now: int, launch) -> None:
        instance, rows = launch.instance, launch.rows
        if instance not in self.idle:
            self._broken(f"launched a batch on instance {instance}, which is not idle")
        if type(rows) is range:
            # Consecutive rows: per-request columns are filled from the batch log at the end
            # (where launching a row twice is caught), so a batch costs O(1) here.
            first, stop = rows.start, rows.stop
            if not (0 <= first < stop <= self.delivered and rows.step == 1):
                self._broken(f"launched rows {rows}, which are not all queued")
            samples = stop - first if self.one_sample_each else int(self.cum_samples[stop] - self.cum_samples[first])
            seq_len = self.one_seq_len
            if seq_len is None:
                seq_len = int(self.req.seq_len[first:stop].max())
            count = stop - first
        else:
            rows = np.asarray(rows, dtype=np.int64)
            if rows.size == 0:
                self._broken("launched an empty batch")
            if (rows >= self.delivered).any() or (rows < 0).any() or (self.status[rows] != QUEUED).any() \
                    or np.unique(rows).size != rows.size:
                self._broken(f"launched rows that are not queued: {rows[:8].tolist()}")
            self.status[rows] = RUNNING
            samples = int(self.req.samples[rows].sum())
            seq_len = self.one_seq_len
            if seq_len is None:
                seq_len = int(self.req.seq_len[rows].max())  # mixed lengths run padded to the longest
            count = rows.size
        self.idle.remove(instance)
        cost = self.cost.at_concurrency(self.busy_after) if self.concurrency_aware else self.cost
        service_ns = int(round(cost.sample_s(samples, seq_len, self.rng) * 1e9))
        if self.freed_at[instance] != now:
            service_ns += self.wake_ns
        self.batches.append((now, now + service_ns, instance, samples, count))
        self.batch_rows.append(rows)
        if self.decisions is not None:
            self.decisions.append((now, "launch", instance, tuple(int(r) for r in rows)))
        Scheduled(self.env, service_ns, COMPLETION, self._on_completion, (instance, rows))

    def _broken(self, what: str) -> None:
        raise PolicyError(f"{type(self.policy).__name__} {what}")

    def _reject(self, now: int, reject) -> None:
        rows = np.asarray(reject.rows, dtype=np.int64)
        if (rows >= self.delivered).any() or (self.status[rows] != QUEUED).any():
            self._broken("rejected rows that are not queued")
        self.status[rows] = REJECT_STATUS.get(reject.reason, REJECTED_QUEUE_FULL)
        self.done_ns[rows] = now
        if self.decisions is not None:
            self.decisions.append((now, reject.reason, -1, tuple(int(r) for r in rows)))

    def _result(self) -> SimResult:
        b = np.array(self.batches, dtype=np.int64).reshape(-1, 5)
        rows = self._batch_row_index(b[:, 4])
        if rows.size:
            if np.bincount(rows, minlength=self.n).max() > 1 or (self.status[rows] > RUNNING).any():
                self._broken("launched a request twice, or one it had rejected")
            counts = b[:, 4]
            # Every launched batch completed: the run ends when no event is left.
            self.start_ns[rows] = np.repeat(b[:, 0], counts)
            self.done_ns[rows] = np.repeat(b[:, 1], counts)
            self.batch_size[rows] = np.repeat(b[:, 3], counts)
            self.instance[rows] = np.repeat(b[:, 2], counts)
            self.status[rows] = COMPLETED
        end = self.done_ns
        if self.keep_order and rows.size:
            # A response waits for every response dispatched before it (Triton's completion queue).
            end = end.copy()
            end[rows] = np.maximum.accumulate(end[rows])
        return SimResult(self.req, self.start_ns, end, self.batch_size, self.instance, self.status,
                         b[:, 0].copy(), b[:, 1].copy(), b[:, 2].astype(np.int16),
                         b[:, 3].astype(np.int32), b[:, 4].astype(np.int32),
                         self.instances, self.seed, self.decisions)

    def _batch_row_index(self, counts: np.ndarray) -> np.ndarray:
        """All launched rows, batch after batch, in dispatch order."""
        if not self.batch_rows:
            return np.empty(0, dtype=np.int64)
        if all(type(r) is range for r in self.batch_rows):
            firsts = np.fromiter((r.start for r in self.batch_rows), np.int64, len(self.batch_rows))
            offsets = np.repeat(firsts - (np.cumsum(counts) - counts), counts)
            return np.arange(int(counts.sum()), dtype=np.int64) + offsets
        return np.concatenate([np.asarray(r, dtype=np.int64) for r in self.batch_rows])
