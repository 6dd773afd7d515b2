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

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from policies.fifo import RowFifo
from schedsim.errors import InputError
from schedsim.core.policy import (NEVER, REJECT_QUEUE_FULL, REJECT_TIMEOUT, Decision, Launch,
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
    """Whether a request's own ``timeout_us`` replaces the default when it is shorter."""

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
    seq_len: int = 0
    oldest_ns: int = NEVER
    open: bool = True
    """Still growing: Triton's batcher has not set payload_saturated_."""
    shape_cut: bool = False
    """Cut by a request of another shape (Triton's Payload::MarkSaturated): never merged."""


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
        self._preferred_list = list(self.preferred_batch_sizes)
        self._is_preferred = np.zeros(self.max_batch_size + 1, dtype=bool)
        self._is_preferred[self._preferred] = True

    def max_batch_samples(self) -> int:
        return self.max_batch_size

    # --- hooks -------------------------------------------------------------------------

    def reset(self, requests: Requests, instances: int) -> None:
        super().reset(requests, instances)
        n = len(requests)
        samples, seq_len = requests.samples, requests.seq_len
        # Reductions first (no 2M-row temporaries); the row is looked for only when one is wrong.
        if n and int(samples.max()) > self.max_batch_size:
            row = int(np.flatnonzero(samples > self.max_batch_size)[0])
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
        # With one level, no queue limit and no timeouts nothing leaves the queue out of
        # order, so the queue is the consecutive rows [head, tail): two integers.
        self._contiguous = levels == 1 and not self._limited and self._deadline is None
        self._head = self._tail = 0
        self._need = 1
        self._shape_cut = False  # whether the last walk stopped at a request of another shape
        # Closed-form walk when no request can cut a batch early (one sample, one shape).
        self._unit = bool(n == 0 or (samples.min() == samples.max() == 1 and seq_len.min() == seq_len.max()))
        self._fast = self._contiguous and self._unit and not self.prefetch
        self._arrival_ns = requests.arrival_ns
        # The common case answers from plain integers; binding it here saves a call per decision.
        self.decide = self._decide_fast if self._fast else self._decide_general

    def _deadlines(self, requests: Requests):
        qps = self._qpolicy
        if not any(qp.default_timeout_us or qp.allow_timeout_override for qp in qps):
            return None
        lvl = self._level if self._level is not None else np.zeros(len(requests), np.int16)
        default = np.array([qp.default_timeout_us * 1000 for qp in qps], dtype=np.int64)[lvl]
        override = np.array([qp.allow_timeout_override for qp in qps])[lvl]
        # As PolicyQueue::Enqueue: a request's own timeout counts only if it is shorter than
        # the level's default (so with no default, requests' timeouts are ignored).
        shorter = (requests.timeout_ns > 0) & (requests.timeout_ns < default)
        timeout = np.where(override & shorter, requests.timeout_ns, default)
        deadline = np.where(timeout > 0, requests.arrival_ns + timeout, NEVER)
        return deadline if (deadline < NEVER).any() else None

    def on_arrivals(self, now_ns: int, first: int, stop: int) -> None:
        if self._contiguous:
            self._tail = stop
            return
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
        return self._decide_general(now_ns, idle)  # replaced per instance in reset()

    def _decide_general(self, now_ns: int, idle: list[int]) -> Decision:
        idle = list(idle)
        if self._deadline is not None:
            self._expire(now_ns)
        launches: list[Launch] = []
        wake = NEVER
        self._need = 1
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
        # A request with a deadline must be seen when it arrives, to wake up at its deadline;
        # with a queue limit, to be rejected at its arrival time.
        wants = wants or self._deadline is not None or self._limited
        return Decision(launches, rejects, wake if self._queued() or self._formed else NEVER, wants,
                        self._need)

    def _decide_fast(self, now_ns: int, idle: list[int]) -> Decision:
        """``decide`` for the common case, in plain integers: one queue of consecutive rows,
        one sample and one shape each, no timeouts, no prefetch. Same answers as the general
        path (tests/unit/core/test_properties.py compares them); with a payload of 0 the walk's
        "would pass the largest preferred size" mark always coincides with a preferred hit.
        """
        head, tail = self._head, self._tail
        idle = list(idle)
        launches = []
        wake, need = NEVER, 1
        preferred, delay, most = self._preferred_list, self.max_queue_delay_ns, self.max_batch_size
        while idle and tail > head:
            queued = tail - head
            send_now = queued > most
            walked = most if send_now else queued
            i = bisect_right(preferred, walked)
            oldest = self._arrival_ns.item(head)
            expired = delay > 0 and now_ns - oldest >= delay
            if i and not expired:
                take = preferred[i - 1]                                   # rule 1
            elif send_now or walked >= self._max_preferred or expired or delay == 0:
                take = walked                                             # rules 2 and 3
            else:
                wake, need = oldest + delay, preferred[i] - walked        # rule 4
                break
            launches.append(Launch(idle.pop(0), range(head, head + take)))
            head += take
        self._head = head
        return Decision(launches, [], wake, bool(idle), need)

    def queue_rule(self):
        """``_decide_fast`` on one idle instance as a function of the queue [head, tail)."""
        if not self._fast:
            return None
        preferred, delay, most = self._preferred_list, self.max_queue_delay_ns, self.max_batch_size
        max_preferred, arrival = self._max_preferred, self._arrival_ns

        def rule(now_ns: int, head: int, tail: int) -> tuple[int, int, int]:
            queued = tail - head
            if queued <= 0:
                return 0, NEVER, 1
            send_now = queued > most
            walked = most if send_now else queued
            i = bisect_right(preferred, walked)
            oldest = arrival.item(head)
            expired = delay > 0 and now_ns - oldest >= delay
            if i and not expired:
                return preferred[i - 1], NEVER, 1                         # rule 1
            if send_now or walked >= max_preferred or expired or delay == 0:
                return walked, NEVER, 1                                   # rules 2 and 3
            return 0, oldest + delay, preferred[i] - walked               # rule 4
        # What the driver's compiled loop needs to run this same rule (schedsim.core.compiled_queue).
        rule.compiled_as = ("dynamic", tuple(preferred), delay, most)
        return rule

    # --- forming a batch ------------------------------------------------------------------

    def _form(self, now_ns: int, payload: int, payload_seq: int = 0) -> tuple[int, int, bool]:
        """Decide as GetDynamicBatch does, on top of ``payload`` samples already formed
        (of seq_len ``payload_seq``).

        Returns (requests to take now, wake-up time if none, whether the batch is saturated,
        Triton's ``payload_saturated_``: a saturated batch stops growing).
        """
        if self._unit:
            walked, send_now, best, marked = self._walk_unit(payload)
            walked_total = payload + walked
        else:
            walked, send_now, best, walked_total, marked = self._walk(payload, payload_seq)
        delay = self.max_queue_delay_ns
        oldest = self._oldest_ns()
        expired = delay > 0 and now_ns - oldest >= delay
        if best and not expired:
            return best, NEVER, marked or delay == 0                  # rule 1
        if walked == 0:
            return 0, NEVER, marked
        if send_now or walked_total >= self._max_preferred:
            return walked, NEVER, True                                # rule 2
        if expired or delay == 0:
            return walked, NEVER, marked                              # rule 3
        if payload and payload not in self.preferred_batch_sizes:
            # Triton moves what it has into a growing payload so an instance that frees up
            # takes the largest batch available, even if not preferred.
            return walked, NEVER, marked
        if self._unit:
            # Nothing changes before the queue reaches the next preferred size.
            self._need = self._preferred_list[bisect_right(self._preferred_list, walked_total)] - walked_total
        return 0, oldest + delay, marked                              # rule 4: wait

    def _walk(self, payload: int, payload_seq: int) -> tuple[int, bool, int, int, bool]:
        """The queue walk, vectorised over the first max_batch_size queued requests.

        Returns (requests walked, whether the walk was cut by size or shape, best in
        requests or 0, samples after the walk including ``payload``, whether the "would
        pass the largest preferred size" mark was taken).
        """
        req = self.requests
        window = self._window()
        samples = req.samples[window].astype(np.int64)
        total = payload + np.cumsum(samples)               # total after adding request k
        checked = total - samples > 0                      # request k joins a non-empty batch
        seq = req.seq_len[window]
        shape = payload_seq if payload else seq[0]         # the batch's shape, set by its first request
        stop = checked & ((total > self.max_batch_size) | (seq != shape))
        send_now = bool(stop.any())
        walked = int(stop.argmax()) if send_now else len(window)
        self._shape_cut = send_now and total[walked] <= self.max_batch_size
        if not send_now and len(window) < self._queued_count():
            send_now = True  # the window holds max_batch_size requests: the next cannot fit
        hits = np.flatnonzero(self._is_preferred[total[:walked]])
        walked_total = int(total[walked - 1]) if walked else payload
        if hits.size:
            return walked, send_now, int(hits[-1]) + 1, walked_total, False
        # The mark is also taken at the request that stops the walk (Triton checks it
        # first). At request 0 on top of a payload nothing is pending, so best stays 0 and
        # the next request marks again.
        seen = walked + 1 if send_now and walked < len(window) else walked
        over = np.flatnonzero(checked[:seen] & (total[:seen] > self._max_preferred))
        if not over.size:
            return walked, send_now, 0, walked_total, False
        best = int(over[0]) if over[0] > 0 else (int(over[1]) if over.size > 1 else 0)
        return walked, send_now, best, walked_total, True

    def _walk_unit(self, payload: int) -> tuple[int, bool, int, bool]:
        """The same walk in closed form when every request is one sample of one shape."""
        self._shape_cut = False
        queued = self._queued_count()
        room = self.max_batch_size - payload
        send_now = queued > room
        walked = room if send_now else queued
        preferred = self._preferred_list
        i = bisect_right(preferred, payload + walked)
        if i and preferred[i - 1] > payload:
            return walked, send_now, preferred[i - 1] - payload, False
        # No preferred hit: the first request that passes the largest preferred size marks
        # (with a hit, a preferred size would have been reached first).
        first_over = max(self._max_preferred - payload, 0)
        seen = walked + 1 if send_now else walked
        if first_over >= seen or (payload == 0 and first_over == 0):
            return walked, send_now, 0, False
        best = max(first_over, 1)
        return walked, send_now, best if best < seen else 0, True

    def _window(self) -> np.ndarray:
        """Up to max_batch_size queued rows in walk order (priority, then delayed, then FIFO)."""
        k = self.max_batch_size
        if self._contiguous:
            return np.arange(self._head, min(self._tail, self._head + k))
        if len(self._queues) == 2 and not len(self._delayed[0]):
            return self._main[0].peek(k)
        parts, left = [], k
        for q in self._queues:
            if left and len(q):
                part = q.peek(left)
                parts.append(part)
                left -= len(part)
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def _pop(self, k: int) -> np.ndarray | range:
        if self._contiguous:
            self._head += k
            return range(self._head - k, self._head)
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
        if self._contiguous:
            return self._tail > self._head
        return any(len(q) for q in self._queues)

    def _queued_count(self) -> int:
        if self._contiguous:
            return self._tail - self._head
        return sum(len(q) for q in self._queues)

    def _oldest_ns(self) -> int:
        arrival = self.requests.arrival_ns
        if self._contiguous:
            return int(arrival[self._head])
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
                take, wake, saturated = self._form(now_ns, tail.samples if tail else 0,
                                                   tail.seq_len if tail else 0)
                if not take:
                    break
                if tail is None:
                    tail = _Payload()
                    self._formed.append(tail)
                rows = np.asarray(self._pop(take))
                tail.rows.append(rows)
                tail.seq_len = int(self.requests.seq_len[rows[0]]) if not tail.samples else tail.seq_len
                tail.samples += int(self.requests.samples[rows].sum())
                tail.oldest_ns = min(tail.oldest_ns, int(self.requests.arrival_ns[rows].min()))
                tail.open = not saturated and tail.samples < self.max_batch_size
                tail.shape_cut = tail.shape_cut or self._shape_cut
            if not (idle and self._formed):
                return wake

    def _take_formed(self, now_ns: int) -> np.ndarray:
        """An instance takes the oldest formed batch; stale ones behind it may join.

        As InstanceQueue::Dequeue: with a delay set, while the next formed batch has waited
        longer than the delay (from its oldest request), fits under max_batch_size, and
        neither was cut by a shape change, it is merged in.
        """
        batch = self._formed.popleft()
        delay = self.max_queue_delay_ns
        if delay and self.max_batch_size > 1 and not batch.shape_cut:
            while self._formed:
                nxt = self._formed[0]
                if nxt.shape_cut or now_ns - nxt.oldest_ns <= delay \
                        or batch.samples + nxt.samples > self.max_batch_size or nxt.seq_len != batch.seq_len:
                    break
                self._formed.popleft()
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
