"""``dynamic``: Triton's dynamic batcher, as it behaves.

The decision follows ``DynamicBatchScheduler::GetDynamicBatch`` in
triton-inference-server/core (``src/dynamic_batch_scheduler.cc``); see
docs/background/triton-dynamic-batcher.md for the rules and where each is tested.

Walk the queue from the head, adding requests (counting samples, not requests):

- each time the running total equals a preferred size, that total becomes ``best``;
- if the next request would pass the largest preferred size and there is no ``best``
  yet, the current total becomes ``best``;
- the walk stops at ``max_batch_size`` or at a request of a different ``seq_len``.

Then: (1) a ``best`` exists and the delay has not expired: send ``best``; (2) the walk
hit max_batch_size or a shape change, or reached the largest preferred size: send all
walked; (3) the delay expired or is 0: send all walked; (4) else wait until the oldest
queued request has waited ``max_queue_delay_us`` (or the nearest timeout).

With ``prefetch`` the batcher keeps forming batches while every instance is busy, up
to two per instance; the newest keeps growing until it saturates or an instance takes
it. Without it, a batch is formed only when an instance is idle (a simple serving
loop, and Triton whenever queue policies are set). Timeouts are enforced eagerly, at
the deadline (Triton checks lazily; the difference is at most its wake-up interval).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from policies.fifo import RowFifo
from schedsim.errors import InputError
from schedsim.policy import (NEVER, REJECT_QUEUE_FULL, REJECT_TIMEOUT, Decision, Launch,
                             Policy, Reject, Requests)

TIMEOUT_ACTIONS = ("REJECT", "DELAY")


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy`` for one priority level."""

    max_queue_size: int = 0
    """Most requests waiting in this level; 0 = unbounded. A full queue rejects at once."""
    default_timeout_us: int = 0
    """How long a request may wait before ``timeout_action``; 0 = forever."""
    timeout_action: str = "REJECT"
    """REJECT answers an expired request with an error; DELAY moves it behind the rest."""
    allow_timeout_override: bool = False
    """Whether a request's own ``timeout_us`` replaces the default."""

    def __post_init__(self):
        _require(self.max_queue_size >= 0, "max_queue_size", self.max_queue_size, "an integer >= 0")
        _require(self.default_timeout_us >= 0, "default_timeout_us", self.default_timeout_us,
                 "an integer >= 0")
        _require(self.timeout_action in TIMEOUT_ACTIONS, "timeout_action", self.timeout_action,
                 "REJECT or DELAY")


def _require(ok: bool, name: str, value, valid: str) -> None:
    if not ok:
        raise InputError(f"{name}: {value!r} is not valid; expected {valid}")


@dataclass(eq=False)
class _Payload:
    """A formed batch waiting for an instance (prefetch only)."""

    rows: list = field(default_factory=list)
    samples: int = 0
    oldest_ns: int = NEVER
    open: bool = True


class DynamicBatcher(Policy):
    """Triton's dynamic batcher. Parameters carry Triton's names (delays in microseconds)."""

    name = "dynamic"

    def __init__(self, max_batch_size: int = 64, preferred_batch_sizes=(),
                 max_queue_delay_us: int = 0, prefetch: bool = False, priority_levels: int = 0,
                 default_priority_level: int = 0, max_queue_size: int = 0,
                 default_timeout_us: int = 0, timeout_action: str = "REJECT",
                 allow_timeout_override: bool = False, priority_queue_policy=None,
                 preserve_ordering: bool = False):
        _require(int(max_batch_size) >= 1, "max_batch_size", max_batch_size, "an integer >= 1")
        preferred = tuple(sorted({int(b) for b in preferred_batch_sizes or ()}))
        for b in preferred:
            _require(1 <= b <= max_batch_size, "preferred_batch_size", b,
                     f"sizes between 1 and max_batch_size ({max_batch_size})")
        _require(int(max_queue_delay_us) >= 0, "max_queue_delay_us", max_queue_delay_us,
                 "an integer >= 0")
        _require(int(priority_levels) >= 0, "priority_levels", priority_levels, "an integer >= 0")
        _require(0 <= int(default_priority_level) <= int(priority_levels), "default_priority_level",
                 default_priority_level, f"a level between 1 and priority_levels ({priority_levels})")
        self.max_batch_size = int(max_batch_size)
        # Triton normalises an empty list to [max_batch_size] (model_config_utils.cc).
        self.preferred_batch_sizes = preferred or (self.max_batch_size,)
        self.max_queue_delay_ns = int(max_queue_delay_us) * 1000
        self.prefetch = bool(prefetch)
        self.priority_levels = int(priority_levels)
        self.default_priority_level = int(default_priority_level) or (1 if priority_levels else 0)
        self.default_queue_policy = QueuePolicy(int(max_queue_size), int(default_timeout_us),
                                                str(timeout_action).upper(), bool(allow_timeout_override))
        self.priority_queue_policy = dict(priority_queue_policy or {})
        for level in self.priority_queue_policy:
            _require(1 <= int(level) <= max(self.priority_levels, 1), "priority_queue_policy",
                     level, f"levels between 1 and priority_levels ({self.priority_levels})")
        self.preserve_ordering = bool(preserve_ordering)
        self._preferred = np.array(self.preferred_batch_sizes, dtype=np.int64)
        self._max_preferred = int(self._preferred[-1])
        self._is_preferred = np.zeros(self.max_batch_size + 1, dtype=bool)
        self._is_preferred[self._preferred] = True

    def max_batch_samples(self) -> int:
        return self.max_batch_size

    # --- hooks -------------------------------------------------------------------------

    def reset(self, requests: Requests, instances: int) -> None:
        super().reset(requests, instances)
        n = len(requests)
        big = np.flatnonzero(requests.samples > self.max_batch_size)
        if big.size:
            row = int(big[0])
            raise InputError(f"trace row {row + 1}: batch {int(requests.samples[row])} exceeds "
                             f"max_batch_size {self.max_batch_size}")
        levels = max(self.priority_levels, 1)
        if self.priority_levels:
            level = np.where(requests.priority == 0, self.default_priority_level, requests.priority)
            bad = np.flatnonzero(level > levels)
            if bad.size:
                raise InputError(f"trace row {int(bad[0]) + 1}: priority {int(level[bad[0]])} is above "
                                 f"priority_levels {self.priority_levels}")
            self._level = (level - 1).astype(np.int16)
        else:
            self._level = None  # one level: every request in queue 0
        self._qpolicy = [self.priority_queue_policy.get(l + 1, self.default_queue_policy)
                         for l in range(levels)]
        self._deadline = self._deadlines(requests)
        self._main = [RowFifo(1024) for _ in range(levels)]
        # DELAY moves expired requests here, behind the unexpired ones of their level.
        self._delayed = [RowFifo(16) for _ in range(levels)]
        self._queues = [q for l in range(levels) for q in (self._main[l], self._delayed[l])]
        self._limited = any(qp.max_queue_size for qp in self._qpolicy)
        self._formed: deque[_Payload] = deque()
        self._rejects: list[Reject] = []
        self._n = n
        # Closed-form walk when no request can cut a batch early (one sample, one shape).
        self._unit = bool(n == 0 or ((requests.samples == 1).all()
                                     and (requests.seq_len == requests.seq_len[0]).all()))

    def _deadlines(self, requests: Requests):
        qps = self._qpolicy
        if not any(qp.default_timeout_us or qp.allow_timeout_override for qp in qps):
            return None
        lvl = self._level if self._level is not None else np.zeros(len(requests), np.int16)
        default = np.array([qp.default_timeout_us * 1000 for qp in qps], dtype=np.int64)[lvl]
        override = np.array([qp.allow_timeout_override for qp in qps])[lvl]
        timeout = np.where(override & (requests.timeout_ns > 0), requests.timeout_ns, default)
        deadline = np.where(timeout > 0, requests.arrival_ns + timeout, NEVER)
        return deadline if (deadline < NEVER).any() else None

    def on_arrivals(self, now_ns: int, first: int, stop: int) -> None:
        if self._level is None and not self._limited:
            self._main[0].push_range(first, stop)
            return
        rows = np.arange(first, stop)
        levels = self._level[rows] if self._level is not None else np.zeros(len(rows), np.int16)
        for l in np.unique(levels):
            mine = rows[levels == l]
            limit = self._qpolicy[l].max_queue_size
            if limit:
                # Nothing leaves a queue between arrivals delivered together, so the first
                # `room` are admitted and the rest find it full (checked per level, as Triton).
                room = max(0, limit - len(self._main[l]) - len(self._delayed[l]))
                if room < len(mine):
                    self._rejects.append(Reject(mine[room:], REJECT_QUEUE_FULL))
                    mine = mine[:room]
            self._main[l].push(mine)

    def decide(self, now_ns: int, idle: list[int]) -> Decision:
        idle = list(idle)
        if self._deadline is not None:
            self._expire(now_ns)
        launches: list[Launch] = []
        wake = NEVER
        if self.prefetch:
            wake = self._decide_prefetch(now_ns, idle, launches)
        else:
            while idle and self._queued():
                take, wake, _ = self._form(now_ns, 0)
                if not take:
                    break
                launches.append(Launch(idle.pop(0), self._pop(take)))
        if self._deadline is not None and self._queued():
            wake = min(wake, self._nearest_deadline())
        rejects, self._rejects = self._rejects, []
        if self.prefetch:
            wants = bool(idle) or len(self._formed) < 2 * self.instances or (
                bool(self._formed) and self._formed[-1].open)
        else:
            wants = bool(idle)
        # A request with a deadline must be seen when it arrives, to wake up at its deadline.
        wants = wants or self._deadline is not None
        return Decision(launches, rejects, wake if self._queued() or self._formed else NEVER, wants)

    # --- forming a batch ------------------------------------------------------------------

    def _form(self, now_ns: int, payload: int) -> tuple[int, int, bool]:
        """Decide as GetDynamicBatch does, on top of ``payload`` samples already formed.

        Returns (requests to take now, wake-up time if none, whether the batch is saturated).
        """
        if self._unit:
            walked, send_now, best = self._walk_unit(payload)
            walked_total = payload + walked
        else:
            walked, send_now, best, walked_total = self._walk(payload)
        delay = self.max_queue_delay_ns
        oldest = self._oldest_ns()
        expired = delay > 0 and now_ns - oldest >= delay
        if best and not expired:
            return best, NEVER, True
        if walked == 0:
            return 0, NEVER, False
        if send_now or walked_total >= self._max_preferred:
            return walked, NEVER, True
        if expired or delay == 0:
            return walked, NEVER, False
        if payload and payload not in self.preferred_batch_sizes:
            # Triton moves what it has into a growing payload so an instance that frees up
            # takes the largest batch available, even if not preferred.
            return walked, NEVER, False
        return 0, oldest + delay, False

    def _walk(self, payload: int) -> tuple[int, bool, int, int]:
        """The queue walk, vectorised over the first max_batch_size queued requests.

        Returns (requests walked, whether the walk was cut by size or shape, best in
        requests or 0, samples after the walk including ``payload``).
        """
        req = self.requests
        window = self._window()
        samples = req.samples[window].astype(np.int64)
        total = payload + np.cumsum(samples)               # total after adding request k
        checked = total - samples > 0                      # request k joins a non-empty batch
        seq = req.seq_len[window]
        stop = checked & ((total > self.max_batch_size) | (seq != seq[0]))
        send_now = bool(stop.any())
        walked = int(stop.argmax()) if send_now else len(window)
        if not send_now and len(window) < self._queued_count():
            send_now = True  # the window holds max_batch_size requests: the next cannot fit
        hits = np.flatnonzero(self._is_preferred[total[:walked]])
        if hits.size:
            best = int(hits[-1]) + 1
        else:
            # The "would pass the largest preferred size" mark is also taken at the request
            # that stops the walk, since Triton checks it first.
            seen = walked + 1 if send_now and walked < len(window) else walked
            over = np.flatnonzero(checked[:seen] & (total[:seen] > self._max_preferred))
            best = int(over[0]) if over.size else 0
        return walked, send_now, best, int(total[walked - 1]) if walked else payload

    def _walk_unit(self, payload: int) -> tuple[int, bool, int]:
        """The same walk in closed form when every request is one sample of one shape."""
        queued = self._queued_count()
        room = self.max_batch_size - payload
        send_now = queued > room
        walked = room if send_now else queued
        hits = self._preferred[(self._preferred > payload) & (self._preferred <= payload + walked)]
        if hits.size:
            return walked, send_now, int(hits[-1]) - payload
        k = self._max_preferred - payload  # index of the request that would pass it
        seen = walked + 1 if send_now else walked
        best = k if 0 <= k < seen and payload + k > 0 else 0
        return walked, send_now, best

    def _window(self) -> np.ndarray:
        """Up to max_batch_size queued rows in walk order (priority, then delayed, then FIFO)."""
        k = self.max_batch_size
        if len(self._queues) == 2 and not len(self._delayed[0]):
            return self._main[0].peek(k)
        parts, left = [], k
        for q in self._queues:
            if left and len(q):
                part = q.peek(left)
                parts.append(part)
                left -= len(part)
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def _pop(self, k: int) -> np.ndarray:
        if len(self._queues) == 2 and not len(self._delayed[0]):
            return self._main[0].pop(k)
        parts = []
        for q in self._queues:
            if k and len(q):
                part = q.pop(min(k, len(q)))
                parts.append(part)
                k -= len(part)
        return np.concatenate(parts)

    def _queued(self) -> bool:
        return any(len(q) for q in self._queues)

    def _queued_count(self) -> int:
        return sum(len(q) for q in self._queues)

    def _oldest_ns(self) -> int:
        arrival = self.requests.arrival_ns
        return min(int(arrival[q.head()]) for q in self._queues if len(q))

    # --- prefetch ----------------------------------------------------------------------

    def _decide_prefetch(self, now_ns: int, idle: list[int], launches: list[Launch]) -> int:
        wake = NEVER
        slots = 2 * self.instances
        while True:
            while idle and self._formed:
                launches.append(Launch(idle.pop(0), self._take_formed(now_ns)))
            wake = NEVER
            while self._queued():
                tail = self._formed[-1] if self._formed and self._formed[-1].open else None
                if tail is None and len(self._formed) >= slots:
                    break
                take, wake, saturated = self._form(now_ns, tail.samples if tail else 0)
                if not take:
                    break
                if tail is None:
                    tail = _Payload()
                    self._formed.append(tail)
                rows = self._pop(take)
                tail.rows.append(rows)
                tail.samples += int(self.requests.samples[rows].sum())
                tail.oldest_ns = min(tail.oldest_ns, int(self.requests.arrival_ns[rows].min()))
                tail.open = not saturated and tail.samples < self.max_batch_size
            if not (idle and self._formed):
                return wake

    def _take_formed(self, now_ns: int) -> np.ndarray:
        batch = self._formed.popleft()
        delay = self.max_queue_delay_ns
        # An instance taking a stale, unfilled batch merges the next formed ones into it.
        if delay and now_ns - batch.oldest_ns >= delay:
            while self._formed and batch.samples + self._formed[0].samples <= self.max_batch_size:
                nxt = self._formed.popleft()
                batch.rows.extend(nxt.rows)
                batch.samples += nxt.samples
        return np.concatenate(batch.rows)

    # --- timeouts ------------------------------------------------------------------------

    def _expire(self, now_ns: int) -> None:
        for l, q in enumerate(self._main):
            if not len(q):
                continue
            expired = self._deadline[q.all()] <= now_ns
            if expired.any():
                rows = q.remove(expired)
                if self._qpolicy[l].timeout_action == "REJECT":
                    self._rejects.append(Reject(rows, REJECT_TIMEOUT))
                else:
                    # DELAY: served after the unexpired requests of the level; never expires again.
                    self._delayed[l].push(rows)

    def _nearest_deadline(self) -> int:
        near = [int(self._deadline[q.all()].min()) for q in self._main if len(q)]
        return min(near) if near else NEVER
