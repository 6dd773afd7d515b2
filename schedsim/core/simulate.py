"""The simulation driver: turns a policy's decisions into timed events.

Arrivals are not events while every instance is busy: requests sit in the trace's
sorted arrays and are handed to the policy in bulk at the next event, so a busy
server costs one event per batch, not per request. When the policy says arrivals may
change its answer (``Decision.wake_on_arrival``), the driver wakes at the arrival it
named (``arrivals_needed``). A decision runs inline at the end of an event when no
other event is due at the same instant; otherwise it is scheduled behind them. A batch
whose completion is due before every other event (a busy server's next batch), or a
timer due first, runs without an event: the event loop would pop it next anyway.

One instance whose policy declares a queue rule (``Policy.queue_rule``) needs no events at
all: the driver decides on the rows arrived by now and moves time to the batch's end, the
timer or the arrival the rule waits for (``_run_queue_rule``), with the same results.

Events go on a small heap of the driver's own (:mod:`schedsim.core.events`), which
fixes the order of simultaneous events; an event run inline is the one that heap would
pop next, so inlining never changes that order.

Instances with a measured pair grid share the GPU (schedsim.core.contention.SharedGpu): their
completions are always events, and a launch or completion re-times the other instances'
running batches by scheduling new completions; the ones they replace are popped and ignored.
"""

from __future__ import annotations

import itertools
import types
from array import array
from bisect import bisect_right

import numpy as np

from schedsim.core.contention import SharedGpu
from schedsim.core.events import COMPLETION, DECISION, EventLoop
from schedsim.core import compiled_queue
from schedsim.core.policy import NEVER, Decision, Policy, Requests
from schedsim.cost.power import GpuClock
from schedsim.cost.protocols import BatchCost, batch_cost
from schedsim.core.results import (checked, COMPLETED, QUEUED, REJECT_STATUS, REJECTED_QUEUE_FULL, RUNNING,
                              PolicyError, SimResult)


def simulate(requests: Requests, policy: Policy, cost, *, instances: int = 1, seed: int = 0,
             record: bool = False) -> SimResult:
    """Replay ``requests`` against ``policy`` on ``instances`` servers costed by ``cost``.

    ``cost`` is a :class:`~schedsim.cost.protocols.BatchCost`, or any object with
    ``sample_s(samples, seq_len, rng)`` (then priced with no optional capability)."""
    return _Driver(requests, policy, cost, instances, seed, record).run()


_WINDOW = 1024   # arrival times converted to Python ints at a time


def pair_grid_model(cost: BatchCost) -> BatchCost | None:
    """The model whose pair-slowdown grid prices instances sharing a GPU with ``cost``:
    ``cost`` itself, else its two-instance contention model, else None (schedsim.core.contention)."""
    return next((m for m in (cost, cost.at_concurrency(2)) if m.pair_slowdown is not None), None)


def _uniforms(rng: np.random.Generator, block: int = 4096):
    """A stand-in for ``rng`` whose ``random()`` serves numbers drawn a block at a time:
    numpy fills a block with exactly the numbers that single calls would return, in
    order, so the service times are the same, without a call into numpy per batch."""
    stream = itertools.chain.from_iterable(iter(lambda: rng.random(block).tolist(), None))
    return types.SimpleNamespace(random=stream.__next__)


class _Driver:
    def __init__(self, requests: Requests, policy: Policy, cost, instances: int, seed: int,
                 record: bool, env: EventLoop | None = None):
        if instances < 1:
            raise ValueError("instances must be >= 1")
        n = len(requests)
        cost = batch_cost(cost)
        self.req, self.policy, self.cost = requests, policy, cost
        self.instances, self.seed = instances, seed
        self.rng = np.random.default_rng(seed)
        # A fleet (schedsim/planning/fleet.py) runs several drivers, one per replica, on one shared loop.
        self.env = env if env is not None else EventLoop()
        self.concurrency_aware = instances > 1
        # Instances with a measured pair grid: batches share the GPU as processor sharing,
        # re-timed whenever another instance starts or ends one (schedsim.core.contention).
        grid_model = pair_grid_model(cost) if self.concurrency_aware else None
        self.shared = SharedGpu(grid_model.pair_slowdown) if grid_model is not None else None
        self.arrival_ns = requests.arrival_ns
        self.n = n
        # Arrival times of rows [window_first, ...) as Python ints (see _deliver).
        self.window: list[int] = []
        self.window_first = 0
        self._cum = None
        self.one_sample_each = bool(n) and int(requests.samples.sum(dtype=np.int64)) == n
        seq = requests.seq_len
        self.one_seq_len = int(seq[0]) if n and seq.min() == seq.max() else None
        # Written during the run only by rejections (done_ns is made by the first); the other
        # per-request columns are filled from the batch log at the end (_result).
        self.done_ns = None
        self.status = np.zeros(n, dtype=np.int8)
        # Six int64 per batch in one array that grows in place (48 B a batch, no objects): start_ns, end_ns,
        # instance, samples, requests, first row; a batch whose rows are not a range has first
        # row -1 and its rows, in order, in array_rows.
        self.log = array("q")
        self.array_rows: list[np.ndarray] = []
        self.idle = list(range(instances))
        # With one draw per batch the draws may come from blocks; a contention model, chosen
        # per batch, might draw otherwise.
        one_draw = cost.one_draw_per_sample and not self.concurrency_aware
        self.uniforms = _uniforms(self.rng) if one_draw else self.rng
        # When each instance last finished a batch: a launch at that same instant is the busy
        # serving loop; any later one first wakes an idle loop and pays the cost's wake overhead.
        self.freed_at = [-1] * instances
        # One GPU's clock under its power cap, when the profile measured it (schedsim.cost.power).
        self.gpu_clock = GpuClock(cost.power_cap) if cost.power_cap is not None else None
        self.wake_ns = cost.wake_ns  # (idle ns, draw) -> extra ns
        # Wake-up draws come from a stream of their own, so service times keep their draws.
        self.wake_rng = np.random.default_rng(None if seed is None else [seed, 1]) if cost.wake_is_random else None
        self.wake_draws = _uniforms(self.wake_rng) if self.wake_rng is not None \
            else types.SimpleNamespace(random=lambda: 0.5)
        self.delivered = 0          # rows [0, delivered) have been handed to the policy
        self.next_arrival_ns = int(self.arrival_ns[0]) if n else NEVER  # of row `delivered`
        self.decision_pending = False
        self.dirty = True           # something happened since the policy last decided
        self.arrival_wake = -1      # row whose arrival an event is scheduled for
        self.awaiting_arrivals = True  # the last decision's wake_on_arrival
        self.timer_at = NEVER
        # Completions of the batches the current decision launched, scheduled when it ends;
        # with an environment of its own, one due before every other event runs inline next,
        # and so does a new timer (see _decide_now).
        self.launched: list[tuple] = []   # (service_ns, instance, rows)
        self.runs_inline = env is None
        self.inline_next = None           # (instance, rows, end_ns) of that completion
        self.inline_timer = None          # or the time of that timer
        self.decisions = [] if record else None
        self.keep_order = bool(policy.preserve_ordering)
        # Skip the call for policies that do not override the no-op hook (most of them).
        hook = policy.on_batch_done
        self.tells_batch_done = getattr(hook, "__func__", hook) is not Policy.on_batch_done

    @property
    def cum_samples(self) -> np.ndarray:
        """Samples of rows [a, b) = cum[b] - cum[a]: O(1) for a consecutive batch. Built on
        first use: with one sample per request (the common case) it is never needed."""
        if self._cum is None:
            self._cum = np.concatenate([[0], np.cumsum(self.req.samples, dtype=np.int64)])
        return self._cum

    def run(self) -> SimResult:
        self.policy.reset(self.req, self.instances)
        rule = self._queue_rule()
        if rule is not None:
            self._run_queue_rule(rule)
            return self._result()
        if self.n:
            self._wake_at_arrival(0)
        else:
            self.policy.on_trace_end(0)
            self._decide_now(0)
            self._run_inline()
        self.env.run()
        return self._result()

    def _queue_rule(self):
        """The policy's queue rule (Policy.queue_rule) when this run can use it: one instance on
        a loop of its own, nothing recorded, no on_batch_done hook."""
        if self.instances != 1 or not self.runs_inline or not self.n or self.decisions is not None \
                or self.tells_batch_done:
            return None
        return self.policy.queue_rule()

    def _run_queue_rule(self, rule) -> None:
        """The run of one instance whose policy decides by a queue rule, without events.

        With one instance the general path decides at three kinds of instants: a batch's end,
        the policy's timer and the arrival it waits for (``arrivals_needed``). Its other
        wake-ups (stale timers, arrivals that a launch made moot) change no answer, which is
        the contract of ``wake_at_ns`` and ``arrivals_needed``. So the loop below is: decide
        at ``now`` on the rows arrived by then; a launch moves ``now`` to its end, a wait to
        the earlier of the timer and that arrival. Launch times, draws and the batch log are
        those of the general path, bit for bit (tests/unit/core/test_fast_paths.py). The
        dynamic batcher's common case runs compiled where it can (compiled_queue).
        """
        if compiled_queue.covers(self, rule):
            compiled_queue.run(self, rule)
            return
        n, arrival = self.n, self.arrival_ns
        cost, draw, sample_s = self.cost, self.uniforms, self.cost.sample_s
        clock, wake_ns, wake_draw = self.gpu_clock, self.wake_ns, self.wake_draws.random
        one_sample, fixed_seq, seq_col = self.one_sample_each, self.one_seq_len, self.req.seq_len
        extend = self.log.extend
        head = tail = 0
        freed = -1                  # when the instance last finished a batch (see freed_at)
        window, w0 = [], 0          # arrival times of rows [w0, ...) as Python ints (see _deliver)
        now = next_arrival = arrival.item(0)
        while True:
            if next_arrival <= now:
                if window and window[-1] > now:
                    tail = bisect_right(window, now, tail - w0) + w0
                else:
                    tail = int(arrival.searchsorted(now, side="right"))
                    window, w0 = arrival[tail:tail + _WINDOW].tolist(), tail
                next_arrival = window[tail - w0] if tail < n else NEVER
            take, wake, need = rule(now, head, tail)
            if take:
                first, head = head, head + take
                if take < 0 or head > tail:
                    self._broken(f"launched rows {range(first, head)}, which are not all queued")
                samples = take if one_sample else int(self.cum_samples[head] - self.cum_samples[first])
                seq_len = fixed_seq if fixed_seq is not None else int(seq_col[first:head].max())
                service_s = sample_s(samples, seq_len, draw)
                if clock is not None:
                    factor = clock.launch(now, samples)
                    if factor != 1.0:
                        dispatch_s = cost.dispatch_s(samples)
                        service_s = dispatch_s + (service_s - dispatch_s) * factor
                service_ns = round(service_s * 1e9)  # an int, as int(round()) gave
                if freed != now:
                    service_ns += wake_ns(now - freed, wake_draw())
                end = now + service_ns
                if clock is not None:
                    clock.ran(end)
                extend((now, end, 0, samples, take, first))
                freed = now = end
                continue
            if wake <= now:
                self._broken(f"asked to wake at {wake} ns, not after now ({now} ns)")
            if tail < n:
                at = arrival.item(min(tail + max(need, 1) - 1, n - 1))
                if at < wake:
                    wake = at
            if wake == NEVER:
                self.delivered = tail
                return
            now = wake

    # --- events ----------------------------------------------------------------------------

    def _wake_at_arrival(self, row: int) -> None:
        row = min(row, self.n - 1)  # the last arrival also ends the trace: always worth a wake-up
        if row < self.delivered or row == self.arrival_wake:
            return
        at = int(self.arrival_ns[row])
        if at >= self.timer_at:
            return  # the timer's decision comes first, and asks again if it still waits
        self.arrival_wake = row
        # Arrivals are delivered by the decision itself, so waking for one is a decision
        # event at the arrival time (after any completion at that instant). Rows arrived by
        # now are delivered: the arrival is later than now.
        self.env.at(at, DECISION, self._on_arrival_wake)

    def _on_arrival_wake(self, event) -> None:
        # A decision since (a batch launched on the idle instance) may have stopped waiting
        # for arrivals: then they would change nothing and wait for the next decision.
        if self.awaiting_arrivals:
            self._on_decision_event(event)

    def _on_completion(self, event) -> None:
        instance, rows = event.value
        self.inline_next = (instance, rows, event.at)
        self._run_inline()

    def _on_timer(self, event) -> None:
        if event.value == self.timer_at:  # a later decision may have moved the timer
            self.timer_at = NEVER
            self.dirty = True
            self._on_decision_event(event)

    def _on_decision_event(self, event) -> None:
        self.decision_pending = False
        self._decide_now(event.at)
        if self.inline_next is not None or self.inline_timer is not None:
            self._run_inline()

    def _run_inline(self) -> None:
        """Complete the batch in ``inline_next`` (the event being processed, or one that a
        decision left to run inline, see _decide_now), or fire the timer in ``inline_timer``,
        and so on while decisions leave one: each is what the event loop would pop next, run
        without an event and the heap. The loop's ``now`` stays at the last event it popped,
        so events are scheduled by absolute time (EventLoop.at)."""
        while self.inline_next is not None or self.inline_timer is not None:
            if self.inline_timer is not None:  # never with inline_next (see _decide_now)
                now, self.inline_timer = self.inline_timer, None
                self.timer_at = NEVER  # what _on_timer does
                self.dirty = True
                self._decide_now(now)
                continue
            instance, rows, now = self.inline_next
            self.inline_next = None
            self.freed_at[instance] = now
            idle = self.idle
            idle.append(instance)
            if len(idle) > 1:
                idle.sort()
            if self.tells_batch_done:
                self.policy.on_batch_done(now, instance, rows)
            self.dirty = True
            if self.env.peek() > now:
                self._decide_now(now)  # nothing else happens at this instant: decide inline
            elif not self.decision_pending:
                self.decision_pending = True
                self.env.at(now, DECISION, self._on_decision_event)

    def _decide_now(self, now: int) -> None:
        if self.next_arrival_ns <= now:
            self._deliver(now)
        if not self.dirty:
            return  # a second wake-up at this instant with nothing new to decide on
        self.dirty = False
        decision = self.policy.decide(now, list(self.idle))
        if type(decision) is not Decision or decision.wake_at_ns <= now:
            decision = checked(self.policy, decision, now)  # a subclass passes; else it raises
        for reject in decision.rejects:
            self._reject(now, reject)
        launches = decision.launches
        if launches:
            if self.concurrency_aware:
                # Batches launched together run together: each sees the others in its concurrency.
                self.busy_after = self.instances - len(self.idle) + len(launches)
            for launch in launches:
                self._launch(now, launch)
            if self.shared is not None:
                self._retime(now)
        wake = decision.wake_at_ns
        timer = wake < NEVER and wake != self.timer_at
        if timer:
            self.timer_at = wake  # scheduled in _schedule, after the arrival wake-up it may spare
        self.awaiting_arrivals = awaiting = decision.wake_on_arrival
        if awaiting:
            self._wake_at_arrival(self.delivered + max(int(decision.arrivals_needed), 1) - 1)
        if timer or self.launched:
            self._schedule(now, wake if timer else NEVER)

    def _schedule(self, now: int, timer: int) -> None:
        """Schedule the decision's new timer (NEVER: none) and the completions it launched.

        They come last; the order of events stays the same, as a completion and a decision
        never tie (priorities) and an arrival wake-up is never at the timer's time. A single
        one due before every other event is the next event of all (a busy server's next
        batch; an idle server's queue delay): _run_inline runs it, which saves an event, a
        heap push and pop and a turn of the event loop.
        """
        launched = self.launched
        env = self.env
        if timer < NEVER:
            if self.runs_inline and not launched and env.peek() > timer:
                self.inline_timer = timer
            else:
                env.at(timer, DECISION, self._on_timer, timer)
        if launched:
            self.launched = []
            service_ns, instance, rows = launched[0]
            if self.runs_inline and len(launched) == 1 and env.peek() > now + service_ns:
                self.inline_next = (instance, rows, now + service_ns)
            else:
                for service_ns, instance, rows in launched:
                    env.at(now + service_ns, COMPLETION, self._on_completion, (instance, rows))

    def _deliver(self, now: int) -> None:
        if self.next_arrival_ns <= now:
            # A few rows arrive between decisions: a bisect in a window of arrival times as
            # Python ints costs less than a call into numpy per decision.
            window, w0 = self.window, self.window_first
            if window and window[-1] > now:
                stop = bisect_right(window, now, self.delivered - w0) + w0
            else:
                stop = int(self.arrival_ns.searchsorted(now, side="right"))
                self.window, self.window_first = self.arrival_ns[stop:stop + _WINDOW].tolist(), stop
            first, self.delivered = self.delivered, stop
            self.next_arrival_ns = self.window[stop - self.window_first] if stop < self.n else NEVER
            self.policy.on_arrivals(now, first, stop)
            self.dirty = True
            if stop == self.n:
                self.policy.on_trace_end(now)

    # --- applying decisions --------------------------------------------------------------

    def _launch(self, now: int, launch) -> None:
        instance, rows = launch.instance, launch.rows
        idle = self.idle
        if instance not in idle:
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
            first = -1
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
            self.array_rows.append(rows)
        idle.remove(instance)
        shared = self.shared
        cost = self.cost.at_concurrency(self.busy_after) if self.concurrency_aware and shared is None else self.cost
        service_s = cost.sample_s(samples, seq_len, self.uniforms)
        if self.gpu_clock is not None:
            factor = self.gpu_clock.launch(now, samples)
            # A batch priced by a contention profile or the pair grid (measured with the GPU
            # shared, under its own load) already carries the clock of that load: it only
            # moves the state.
            if cost is self.cost and shared is None and factor != 1.0:
                dispatch_s = cost.dispatch_s(samples)
                service_s = dispatch_s + (service_s - dispatch_s) * factor
        service_ns = round(service_s * 1e9)  # an int, as int(round()) gave
        if self.freed_at[instance] != now:
            service_ns += self.wake_ns(now - self.freed_at[instance], self.wake_draws.random())
        if self.gpu_clock is not None:
            self.gpu_clock.ran(now + service_ns)
        if shared is not None:
            # Its time alone; _retime schedules its end once the decision's launches are known.
            shared.start(instance, now, service_ns, samples, (rows, len(self.log) // 6))
        else:
            self.launched.append((service_ns, instance, rows))
        self.log.extend((now, now + service_ns, instance, samples, count, first))
        self.last_count = count
        if self.decisions is not None:
            self.decisions.append((now, "launch", instance, tuple(int(r) for r in rows)))

    def _retime(self, now: int) -> None:
        """Schedule the new end of every running batch whose end moved (see SharedGpu)."""
        for instance, end, generation in self.shared.retime(now):
            if self.gpu_clock is not None:
                self.gpu_clock.ran(end)
            self.env.at(end, COMPLETION, self._on_shared_completion, (instance, generation))

    def _on_shared_completion(self, event) -> None:
        instance, generation = event.value
        if not self.shared.is_current(instance, generation):
            return  # re-timed since: a later completion event stands for this batch
        now = event.at
        rows, index = self.shared.finish(instance, now)
        self.log[6 * index + 1] = now
        self._retime(now)  # the other instance's batch now runs alone
        self.inline_next = (instance, rows, now)
        self._run_inline()

    def _done_ns(self) -> np.ndarray:
        if self.done_ns is None:
            self.done_ns = np.full(self.n, -1, dtype=np.int64)
        return self.done_ns

    def _broken(self, what: str) -> None:
        raise PolicyError(f"{type(self.policy).__name__} {what}")

    def _reject(self, now: int, reject) -> None:
        rows = np.asarray(reject.rows, dtype=np.int64)
        if (rows >= self.delivered).any() or (self.status[rows] != QUEUED).any():
            self._broken("rejected rows that are not queued")
        self.status[rows] = REJECT_STATUS.get(reject.reason, REJECTED_QUEUE_FULL)
        self._done_ns()[rows] = now
        if self.decisions is not None:
            self.decisions.append((now, reject.reason, -1, tuple(int(r) for r in rows)))

    def _result(self) -> SimResult:
        b = np.frombuffer(self.log, np.int64).reshape(-1, 6) if len(self.log) else np.empty((0, 6), np.int64)
        counts = b[:, 4]
        if self._ran_every_row_in_order(b):
            # Batch k ran rows [c_k, c_k + counts[k]): each column repeats the batch log.
            if (self.status > RUNNING).any():
                self._broken("launched a request twice, or one it had rejected")
            start_ns = np.repeat(b[:, 0], counts)
            self.done_ns = np.repeat(b[:, 1], counts)
            batch_size = np.repeat(b[:, 3].astype(np.int32), counts)
            instance = np.repeat(b[:, 2].astype(np.int16), counts)
            self.status.fill(COMPLETED)
        else:
            start_ns, batch_size, instance = self._scatter(b)
        end = self.done_ns
        if self.keep_order and len(counts):
            # A response waits for every response dispatched before it (Triton's completion queue).
            rows = self._batch_row_index(b)
            end = end.copy()
            end[rows] = np.maximum.accumulate(end[rows])
        return SimResult(self.req, start_ns, end, batch_size, instance, self.status,
                         b[:, 0].copy(), b[:, 1].copy(), b[:, 2].astype(np.int16),
                         b[:, 3].astype(np.int32), counts.astype(np.int32),
                         self.instances, self.seed, self.decisions)

    def _ran_every_row_in_order(self, b: np.ndarray) -> bool:
        """Whether the batches, as ranges, tile rows 0..n-1 in order (each row ran once)."""
        counts = b[:, 4]
        if not self.n or self.array_rows or int(counts.sum()) != self.n:
            return False
        return bool((b[:, 5] == np.cumsum(counts) - counts).all())

    def _scatter(self, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-request start, batch size and instance from the batch log, in general."""
        n = self.n
        start_ns = np.full(n, -1, dtype=np.int64)
        batch_size = np.zeros(n, dtype=np.int32)
        instance = np.full(n, -1, dtype=np.int16)
        counts = b[:, 4]
        rows = self._batch_row_index(b)
        done_ns = self._done_ns()
        if rows.size:
            if np.bincount(rows, minlength=n).max() > 1 or (self.status[rows] > RUNNING).any():
                self._broken("launched a request twice, or one it had rejected")
            # Every launched batch completed: the run ends when no event is left.
            start_ns[rows] = np.repeat(b[:, 0], counts)
            done_ns[rows] = np.repeat(b[:, 1], counts)
            batch_size[rows] = np.repeat(b[:, 3], counts)
            instance[rows] = np.repeat(b[:, 2], counts)
            self.status[rows] = COMPLETED
        return start_ns, batch_size, instance

    def _batch_row_index(self, b: np.ndarray) -> np.ndarray:
        """All launched rows, batch after batch, in dispatch order."""
        counts, firsts = b[:, 4], b[:, 5]
        if not self.array_rows:
            offsets = np.repeat(firsts - (np.cumsum(counts) - counts), counts)
            return np.arange(int(counts.sum()), dtype=np.int64) + offsets
        arrays = iter(self.array_rows)
        return np.concatenate([np.arange(f, f + c, dtype=np.int64) if f >= 0 else next(arrays)
                               for f, c in zip(firsts.tolist(), counts.tolist())] or [np.empty(0, np.int64)])
