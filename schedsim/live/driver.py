"""The live driver: turns a policy's decisions into engine calls and blocking waits.

The same policy objects as :mod:`schedsim.core.simulate`, the same hooks in the same order
(completions, then arrivals, then one ``decide``), but time is the host clock and a
batch's duration is whatever the engine takes. The trace is replayed open loop: request
``i`` is *scheduled* at ``t0 + arrival_ns[i]`` and its latency counts from then, as
MLPerf LoadGen does, so a dispatcher that is late counts against the system.

Threads:

- one **worker** per instance owns its engine (its stream, graphs and buffers). It runs
  the batches it is handed, and when one finishes it takes the policy lock and runs the
  decision step itself, so a completion is turned into the next launch on the same
  thread, with no hand-off;
- the calling thread is the **timekeeper**: it sleeps until the next arrival the policy
  asked to see (``wake_on_arrival`` / ``arrivals_needed``) or its timer (``wake_at_ns``),
  then runs the step. It sleeps on an event with a timeout (the timer slack of the
  driver's threads is set to 1 ns on Linux, so a timed wait ends within a few tens of
  µs) and, with ``spin_us``, busy-waits the last stretch.

Every hook and ``decide`` runs under one lock, so the policy sees one thread at a time.
Per batch the driver records the decision time, when the engine call was issued, when it
returned and the engine's own timings (``DIR/batches.csv``); per wake-up, how late it
was. :func:`run_live` returns the same :class:`~schedsim.core.results.SimResult` as the
simulator, so metrics and reports work unchanged.

An engine is a context manager with ``infer(batch, seq_len, input_ids)``; optional:
``host_input(batch, seq_len)`` (a staging array the driver fills in place),
``prepare(batch, seq_len)``, ``last_issue_ns`` / ``last_done_ns`` (``perf_counter_ns``
around the engine's own work), ``last_gpu_ms``, ``max_batch``, ``max_seq_len``, ``vocab``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import heapq
import math
import sys
import threading
import time
from collections import deque
from queue import SimpleQueue

import numpy as np

from schedsim.files import write_columns_csv
from schedsim.core.policy import NEVER, REJECT_TIMEOUT, Requests
from schedsim.core.results import (ask, COMPLETED, FAILED, QUEUED, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT,
                               RUNNING, PolicyError, SimResult)

BATCH_COLUMNS = ("batch", "instance", "requests", "samples", "seq_len", "trigger", "trigger_s",
                 "decide_s", "issue_s", "done_s", "dispatch_us", "gap_us", "host_ms", "gpu_ms",
                 "status", "error")
"""Columns of batches.csv (times in s from the trace start, like requests.csv)."""

TRIGGERS = ("arrival", "timer", "completion")
_ARRIVAL, _TIMER, _COMPLETION = range(3)


def timer_slack(ns: int = 1) -> int | None:
    """Set this thread's timer slack (Linux) and return the old one; None where unsupported.

    Linux lets a normal thread's timed waits end up to 50 µs late by default, which a
    dispatcher with sub-millisecond queue delays would pay on every wake-up; 1 ns makes
    them end as soon as the scheduler can run the thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        old = libc.prctl(30, 0, 0, 0, 0)  # PR_GET_TIMERSLACK
        if old < 0 or libc.prctl(29, ns, 0, 0, 0) != 0:  # PR_SET_TIMERSLACK
            return None
        return old
    except (OSError, AttributeError):
        return None


class InputIds:
    """Real input ids for every request: ``samples`` rows of ``seq_len`` token ids each.

    Ids come from a seeded pool of ``pool`` random sequences; sample ``k`` of the trace
    (counting samples in trace order) reads pool row ``k % pool``. A batch's ids are
    gathered into the engine's staging buffer with one ``np.take``; requests shorter than
    the batch's seq_len are padded with id 0 (the trace's padding rule).
    """

    def __init__(self, requests: Requests, seq_len: np.ndarray, vocab: int, *, seed: int = 0,
                 pool: int = 4096):
        rng = np.random.default_rng(seed)
        self.seq_len = seq_len
        width = int(seq_len.max()) if len(seq_len) else 1
        lo = 1000 if vocab > 2000 else 1   # BERT's vocabulary starts with special tokens
        self.pool = rng.integers(lo, vocab, size=(pool, width), dtype=np.int64)
        self.first_sample = np.concatenate([[0], np.cumsum(requests.samples, dtype=np.int64)])
        self._by_len: dict[int, np.ndarray] = {}
        self.one_each = bool(len(requests) and self.first_sample[-1] == len(requests))

    def _pool(self, s: int) -> np.ndarray:
        p = self._by_len.get(s)
        if p is None:
            p = self._by_len[s] = np.ascontiguousarray(self.pool[:, :s])
        return p

    def fill(self, out: np.ndarray, rows, seq_len: int) -> None:
        """Write the ids of ``rows`` (batch order) into ``out`` [samples, seq_len]."""
        n = len(self.pool)
        if type(rows) is range and self.one_each:
            a, b = rows.start % n, rows.start % n + len(rows)
            if b <= n:
                idx = slice(a, b)
            else:
                idx = np.arange(rows.start, rows.stop) % n
        else:
            rows = np.asarray(rows, dtype=np.int64)
            first, stop = self.first_sample[rows], self.first_sample[rows + 1]
            idx = np.concatenate([np.arange(f, s) for f, s in zip(first.tolist(), stop.tolist())]) % n
        pool = self._pool(seq_len)
        if isinstance(idx, slice):
            np.copyto(out, pool[idx])
        else:
            np.take(pool, idx, axis=0, out=out)
        lens = self.seq_len[rows] if type(rows) is not range else None
        if lens is not None and (lens < seq_len).any():
            counts = self.first_sample[rows + 1] - self.first_sample[rows]
            for k, L in enumerate(np.repeat(lens, counts).tolist()):
                out[k, L:] = 0


def _stats(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not x.size:
        return {"n": 0}
    return {"n": int(x.size), "mean": float(x.mean()), "p50": float(np.percentile(x, 50)),
            "p99": float(np.percentile(x, 99)), "max": float(x.max())}


class _Driver:
    def __init__(self, requests: Requests, policy, engines: list, *, seq_len: np.ndarray,
                 ids: InputIds, spin_ns: int, wake_every_arrival: bool, clock=time.perf_counter_ns):
        n = len(requests)
        self.req, self.policy, self.engines = requests, policy, engines
        self.instances = len(engines)
        self.n = n
        self.arrival_ns = requests.arrival_ns
        self.seq_len = seq_len
        self.one_seq_len = int(seq_len[0]) if n and (seq_len == seq_len[0]).all() else None
        self.cum_samples = ids.first_sample
        self.ids = ids
        self.spin_ns = int(spin_ns)
        self.every_arrival = bool(wake_every_arrival)
        self.clock = clock
        self.t0 = 0
        self.start_ns = np.full(n, -1, dtype=np.int64)
        self.done_ns = np.full(n, -1, dtype=np.int64)
        self.delivered_ns = np.full(n, -1, dtype=np.int64)
        self.batch_size = np.zeros(n, dtype=np.int32)
        self.instance = np.full(n, -1, dtype=np.int16)
        self.status = np.zeros(n, dtype=np.int8)
        self.batches: list[list] = []     # see BATCH_COLUMNS; filled by the step and the worker
        self.batch_rows: list = []
        self.failures: list[dict] = []
        self.idle = list(range(self.instances))
        self.running = 0
        self.delivered = 0
        self.next_arrival_ns = int(self.arrival_ns[0]) if n else NEVER
        self.wake_rows: list[int] = [0] if n else []  # heap: rows whose arrival the policy wants to see
        self.timer_at = NEVER
        self.dirty = True
        self.lateness: list[tuple[int, int, int]] = []  # (kind, due ns, ns late) per timed wake-up
        self.steps = 0
        self.decisions = 0
        self.lock = threading.Lock()
        self.rearm = threading.Event()
        self.armed_ns = NEVER             # the due time the timekeeper sleeps towards
        self.done_q: deque = deque()
        self.queues = [SimpleQueue() for _ in engines]
        self.stopping = False
        self.fatal: BaseException | None = None
        self.keep_order = bool(policy.preserve_ordering)

    def now(self) -> int:
        return self.clock() - self.t0

    # --- the decision step (always under self.lock) -------------------------------------

    def _step(self, trigger: int, target_ns: int) -> None:
        """Completions, then arrivals, then one decision: the simulator's order at an instant.

        ``trigger`` says what woke the caller (for the batch log): a completion, or the
        timekeeper at ``target_ns``, the due time of the timer or of a wanted arrival.
        """
        now = self.now()
        self.steps += 1
        while self.done_q:
            self._complete(now, *self.done_q.popleft())
        if self.stopping:
            return
        if self.timer_at <= now:
            if trigger == _TIMER:
                self.lateness.append((_TIMER, target_ns, now - target_ns))
            self.timer_at = NEVER
            self.dirty = True
        if self.next_arrival_ns <= now:
            if trigger == _ARRIVAL:
                # Issue lateness: how late the arrival the dispatcher woke for reached the policy.
                self.lateness.append((_ARRIVAL, target_ns, now - target_ns))
            self._deliver(now)
        if self.dirty:
            self.dirty = False
            self._decide(now, trigger, target_ns)
        if self._due() < self.armed_ns or self._finished():
            self.rearm.set()

    def _decide(self, now: int, trigger: int, target_ns: int) -> None:
        self.decisions += 1
        decision = ask(self.policy, now, list(self.idle))
        for reject in decision.rejects:
            self._reject(now, reject)
        for launch in decision.launches:
            self._launch(now, launch, trigger, target_ns)
        wake = decision.wake_at_ns
        if wake < NEVER and wake != self.timer_at:
            self.timer_at = wake
        if decision.wake_on_arrival and self.delivered < self.n:
            # The last arrival also ends the trace: always worth a wake-up (as the simulator).
            row = min(self.delivered + max(int(decision.arrivals_needed), 1) - 1, self.n - 1)
            if row not in self.wake_rows:
                heapq.heappush(self.wake_rows, row)

    def _deliver(self, now: int) -> None:
        stop = int(self.arrival_ns.searchsorted(now, side="right"))
        first, self.delivered = self.delivered, stop
        self.next_arrival_ns = int(self.arrival_ns[stop]) if stop < self.n else NEVER
        self.delivered_ns[first:stop] = now
        while self.wake_rows and self.wake_rows[0] < stop:
            heapq.heappop(self.wake_rows)
        self.policy.on_arrivals(now, first, stop)
        self.dirty = True
        if stop == self.n:
            self.policy.on_trace_end(now)

    def _launch(self, now: int, launch, trigger: int, target_ns: int) -> None:
        instance, rows = launch.instance, launch.rows
        if instance not in self.idle:
            raise PolicyError(f"{type(self.policy).__name__} launched a batch on instance {instance}, "
                              "which is not idle")
        if type(rows) is range:
            if not (0 <= rows.start < rows.stop <= self.delivered and rows.step == 1) \
                    or (self.status[rows.start:rows.stop] != QUEUED).any():
                raise PolicyError(f"{type(self.policy).__name__} launched rows {rows}, which are not all queued")
            sl = slice(rows.start, rows.stop)
            count = len(rows)
            samples = int(self.cum_samples[rows.stop] - self.cum_samples[rows.start])
        else:
            rows = np.asarray(rows, dtype=np.int64)
            if rows.size == 0 or (rows >= self.delivered).any() or (rows < 0).any() \
                    or (self.status[rows] != QUEUED).any() or np.unique(rows).size != rows.size:
                raise PolicyError(f"{type(self.policy).__name__} launched rows that are not queued: "
                                  f"{rows[:8].tolist()}")
            sl = rows
            count = rows.size
            samples = int(self.req.samples[rows].sum())
        seq_len = self.one_seq_len
        if seq_len is None:
            seq_len = int(self.seq_len[sl].max())  # mixed lengths run padded to the longest
        self.status[sl] = RUNNING
        self.start_ns[sl] = now
        self.batch_size[sl] = samples
        self.instance[sl] = instance
        self.idle.remove(instance)
        self.running += 1
        b = len(self.batches)
        self.batches.append([b, instance, count, samples, seq_len, trigger, target_ns, now,
                             -1, -1, math.nan, 0, ""])
        self.batch_rows.append(rows)
        self.queues[instance].put(b)

    def _reject(self, now: int, reject) -> None:
        rows = np.asarray(reject.rows, dtype=np.int64)
        if (rows >= self.delivered).any() or (self.status[rows] != QUEUED).any():
            raise PolicyError(f"{type(self.policy).__name__} rejected rows that are not queued")
        self.status[rows] = REJECTED_TIMEOUT if reject.reason == REJECT_TIMEOUT else REJECTED_QUEUE_FULL
        self.done_ns[rows] = now

    def _complete(self, now: int, b: int, issue_ns: int, done_ns: int, gpu_ms: float, error: str) -> None:
        rec = self.batches[b]
        rec[8], rec[9], rec[10] = issue_ns, done_ns, gpu_ms
        rows = self.batch_rows[b]
        sl = slice(rows.start, rows.stop) if type(rows) is range else rows
        if done_ns < 0:
            # Handed to a worker after the run was stopped: never ran, so still unfinished.
            self.status[sl], self.start_ns[sl], self.batch_size[sl], self.instance[sl] = QUEUED, -1, 0, -1
        elif error:
            rec[11], rec[12] = 1, error
            self.status[sl] = FAILED
            self.done_ns[sl] = done_ns
            self.failures.append({"batch": b, "instance": rec[1], "error": error,
                                  "rows": list(rows)[:64] if type(rows) is range else rows[:64].tolist()})
        else:
            self.status[sl] = COMPLETED
            self.done_ns[sl] = done_ns
        instance = rec[1]
        self.idle.append(instance)
        if len(self.idle) > 1:
            self.idle.sort()
        self.running -= 1
        self.policy.on_batch_done(now, instance, rows)
        self.dirty = True

    def _due(self) -> int:
        """The next time the timekeeper must run the step: a timer or a wanted arrival."""
        due = self.timer_at
        if self.every_arrival:
            due = min(due, self.next_arrival_ns)
        elif self.wake_rows:
            due = min(due, int(self.arrival_ns[self.wake_rows[0]]))
        return due

    def _finished(self) -> bool:
        return (self.delivered == self.n and not self.running and not self.done_q
                and self.timer_at == NEVER)

    # --- threads ----------------------------------------------------------------------------

    def _locked_step(self, trigger: int, target_ns: int) -> None:
        with self.lock:
            try:
                self._step(trigger, target_ns)
            except Exception as exc:  # a policy bug: stop the run, re-raise in the caller
                if self.fatal is None:
                    self.fatal = exc
                self.stopping = True
                self.rearm.set()

    def worker(self, instance: int) -> None:
        timer_slack(1)
        engine = self.engines[instance]
        queue = self.queues[instance]
        host_input = getattr(engine, "host_input", None)
        clock = self.clock
        while True:
            b = queue.get()
            if b is None:
                return
            if self.stopping:
                self.done_q.append((b, -1, -1, math.nan, ""))
                continue
            samples, seq_len = self.batches[b][3], self.batches[b][4]
            issue, gpu_ms, error = -1, math.nan, ""
            try:
                buf = host_input(samples, seq_len) if host_input else np.empty((samples, seq_len), np.int64)
                self.ids.fill(buf, self.batch_rows[b], seq_len)
                issue = clock()
                engine.infer(samples, seq_len, buf)
                done = clock()
                issue = getattr(engine, "last_issue_ns", 0) or issue
                done = getattr(engine, "last_done_ns", 0) or done
                gpu_ms = float(getattr(engine, "last_gpu_ms", math.nan))
            except Exception as exc:  # noqa: BLE001 - an engine error fails this batch; the run goes on
                done = clock()
                issue = issue if issue >= 0 else done
                error = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
            self.done_q.append((b, issue - self.t0, done - self.t0, gpu_ms, error))
            self._locked_step(_COMPLETION, done - self.t0)

    def timekeeper(self, deadline_ns: int, stop: threading.Event | None) -> str | None:
        """Run the timed wake-ups until the run is over; returns why it stopped early, if it did."""
        spin = self.spin_ns
        clock, rearm = self.clock, self.rearm
        while True:
            with self.lock:
                if self.fatal is not None:
                    return "error"
                if self._finished():
                    return None
                due = self._due()
                kind = _TIMER if due == self.timer_at else _ARRIVAL
                self.armed_ns = due
            if stop is not None and stop.is_set():
                return "stopped"
            target = min(due, deadline_ns)
            now = self.now()
            if now < target:
                wait_ns = target - now - spin
                if wait_ns > 0:
                    # Wake at least every 0.2 s to notice a stop request.
                    if rearm.wait(min(wait_ns, 200_000_000) / 1e9):
                        rearm.clear()
                    continue
                end = target + self.t0
                while clock() < end and not rearm.is_set():
                    pass
                if rearm.is_set():
                    rearm.clear()
                    continue
            if due > deadline_ns:
                return "time limit"
            self._locked_step(kind, due)

    # --- the result ---------------------------------------------------------------------------

    def result(self, stopped_ns: int | None) -> SimResult:
        """The SimResult; after an early stop, only the requests scheduled before it."""
        keep = self.n if stopped_ns is None else int(self.arrival_ns.searchsorted(stopped_ns, side="right"))
        end = self.done_ns
        if self.keep_order and self.batch_rows:
            # A response waits for every response dispatched before it (as the simulator).
            end = end.copy()
            order = np.concatenate([np.arange(r.start, r.stop) if type(r) is range else np.asarray(r)
                                    for r in self.batch_rows])
            order = order[self.status[order] == COMPLETED]
            end[order] = np.maximum.accumulate(end[order])
        b = np.array([r[:10] for r in self.batches], dtype=np.int64).reshape(-1, 10)
        ran = b[:, 9] >= 0
        req = self.req
        if keep < self.n:
            req = req.head(keep)
        res = SimResult(req, self.start_ns[:keep], end[:keep], self.batch_size[:keep],
                        self.instance[:keep], self.status[:keep],
                        b[ran, 7].copy(), b[ran, 9].copy(), b[ran, 1].astype(np.int16),
                        b[ran, 3].astype(np.int32), b[ran, 2].astype(np.int32), self.instances, 0)
        return res


def _vocab(engine) -> int:
    """Token ids are drawn below this: the engine's vocabulary, else a safe 1000."""
    cfg = getattr(getattr(engine, "model", None), "cfg", None)
    return int(getattr(engine, "vocab", None) or getattr(cfg, "vocab", None) or 1000)


def _shapes(policy, requests: Requests, seq_len: np.ndarray) -> tuple[int, list[int]]:
    largest = policy.max_batch_samples()
    if largest is None:
        largest = int(requests.samples.max()) if len(requests) else 1
    return int(largest), sorted({int(s) for s in np.unique(seq_len)})


def check_engine_fits(engine, largest: int, seq_lens: list[int], what: str = "the model") -> None:
    """Raise InputError when the engine cannot take the batches the policy may launch."""
    from schedsim.errors import InputError

    max_batch = getattr(engine, "max_batch", None)
    max_seq = getattr(engine, "max_seq_len", None)
    if max_batch is not None and largest > max_batch:
        raise InputError(f"{what} takes batches of up to {max_batch} samples, but the policy may launch "
                         f"{largest}; lower the policy's batch size")
    if max_seq is not None and seq_lens and max(seq_lens) > max_seq:
        raise InputError(f"{what} takes seq_len up to {max_seq}, but the trace has seq_len "
                         f"{max(seq_lens)}; use a trace with shorter requests")


def warm_up_engine(engine, ids: InputIds, largest: int, seq_lens: list[int], iterations: int = 2) -> None:
    """Prepare (capture) and run every shape the policy may launch, before the clock starts."""
    prepare = getattr(engine, "prepare", None)
    host_input = getattr(engine, "host_input", None)
    for s in seq_lens:
        for b in range(1, largest + 1):
            if prepare is not None:
                prepare(b, s)
            buf = host_input(b, s) if host_input else np.empty((b, s), np.int64)
            buf[...] = ids.pool[np.arange(b) % len(ids.pool), :s]
            for _ in range(iterations):
                engine.infer(b, s, buf)


def run_live(requests: Requests, policy, engine_factory, *, instances: int = 1,
             warmup_s: float = 0.0, time_limit_s: float | None = None, default_seq_len: int = 128,
             spin_us: float = 0.0, wake_every_arrival: bool = False, seed: int = 0,
             engine_warmup: int = 2, switch_interval_us: float | None = None,
             stop: threading.Event | None = None, start_delay_s: float = 0.05) -> tuple[SimResult, dict]:
    """Replay ``requests`` in real time against ``policy`` on ``instances`` live engines.

    ``engine_factory(i)`` returns a context manager that yields instance ``i``'s engine
    (entered here, in this thread; pass ``contextlib.nullcontext(engine)`` to reuse an
    open one). Requests with seq_len 0 run at ``default_seq_len``. ``spin_us``: busy-wait
    this long before each timed wake-up instead of sleeping. ``wake_every_arrival``: wake
    at every arrival whatever the policy said (for checking that its hints are safe).
    ``switch_interval_us``: the interpreter's thread switch interval during the run
    (None leaves it). ``warmup_s`` only selects which wake-ups and batches the returned
    statistics count; :func:`schedsim.core.metrics.summarize` excludes requests the same way.
    ``time_limit_s`` (from the trace start), ``stop`` (an Event) and Ctrl-C end the run
    early: in-flight batches finish, and the result holds the requests scheduled so far
    (``extra["partial"]`` says why).

    Returns the per-request result and ``extra``: lateness, dispatch overhead and engine
    timings (summaries), the per-batch table (``extra["batches"]``) and failures.
    """
    if instances < 1:
        raise ValueError("instances must be >= 1")
    n = len(requests)
    seq_len = np.where(requests.seq_len > 0, requests.seq_len, default_seq_len).astype(np.int32)
    policy.reset(requests, instances)
    largest, seq_lens = _shapes(policy, requests, seq_len)
    with contextlib.ExitStack() as stack:
        engines = [stack.enter_context(engine_factory(i)) for i in range(instances)]
        for i, engine in enumerate(engines):
            check_engine_fits(engine, largest, seq_lens)
        ids = InputIds(requests, seq_len, _vocab(engines[0]), seed=seed)
        t_setup = time.perf_counter()
        for engine in engines:
            warm_up_engine(engine, ids, largest, seq_lens, engine_warmup)
        setup_s = time.perf_counter() - t_setup
        policy.reset(requests, instances)  # fresh state: prepare may have taken long
        driver = _Driver(requests, policy, engines, seq_len=seq_len, ids=ids,
                         spin_ns=int(spin_us * 1000), wake_every_arrival=wake_every_arrival)
        old_switch = sys.getswitchinterval()
        gc_was = gc.isenabled()
        threads = [threading.Thread(target=driver.worker, args=(i,), name=f"schedsim-live-{i}", daemon=True)
                   for i in range(instances)]
        reason = None
        old_slack = timer_slack(1)
        try:
            gc.collect()
            gc.disable()  # a collection pause would land in someone's latency
            if switch_interval_us is not None:
                sys.setswitchinterval(switch_interval_us / 1e6)
            for t in threads:
                t.start()
            driver.t0 = time.perf_counter_ns() + int(start_delay_s * 1e9)
            deadline = NEVER if time_limit_s is None else int(time_limit_s * 1e9)
            if n == 0:
                with driver.lock:
                    policy.on_trace_end(0)
            try:
                reason = driver.timekeeper(deadline, stop)
            except KeyboardInterrupt:
                reason = "interrupted"
            stopped_ns = driver.now()
        finally:
            with driver.lock:
                driver.stopping = True
            for q in driver.queues:
                q.put(None)
            for t in threads:
                t.join(timeout=30.0)
            sys.setswitchinterval(old_switch)
            if old_slack is not None:
                timer_slack(old_slack)
            if gc_was:
                gc.enable()
        if driver.fatal is not None:
            raise driver.fatal
        with driver.lock:
            while driver.done_q:
                driver._complete(driver.now(), *driver.done_q.popleft())
    partial = reason is not None
    result = driver.result(stopped_ns if partial else None)
    extra = _extra(driver, result, warmup_s)
    extra.update(partial=partial, partial_reason=reason, stopped_at_s=stopped_ns / 1e9 if partial else None,
                 trace_requests=n, setup_s=setup_s,
                 options={"instances": instances, "spin_us": spin_us, "wake_every_arrival": wake_every_arrival,
                          "switch_interval_us": sys.getswitchinterval() * 1e6 if switch_interval_us is None
                          else switch_interval_us, "timer_slack_1ns": old_slack is not None, "engine_warmup": engine_warmup,
                          "default_seq_len": default_seq_len, "gc_disabled": True, "seed": seed})
    return result, extra


def _extra(driver: _Driver, result: SimResult, warmup_s: float) -> dict:
    """Per-batch table and summaries of lateness, dispatch overhead and engine timings."""
    t_warm = int(round(warmup_s * 1e9))
    recs = driver.batches
    b = np.array([r[:10] for r in recs], dtype=np.int64).reshape(-1, 10)
    trig, trig_ns, decide, issue, done = b[:, 5], b[:, 6], b[:, 7], b[:, 8], b[:, 9]
    gpu_ms = np.array([r[10] for r in recs], dtype=np.float64)
    ran = done >= 0
    dispatch_us = np.where(ran, (issue - decide) / 1e3, np.nan)
    # From what woke the dispatcher (a completion, a due timer or arrival) to the engine call:
    # what the cost model's dispatch_overhead_us stands for when the trigger is a completion.
    gap_us = np.where(ran, (issue - np.minimum(trig_ns, decide)) / 1e3, np.nan)
    host_ms = np.where(ran, (done - issue) / 1e6, np.nan)
    batches = {
        "batch": b[:, 0], "instance": b[:, 1], "requests": b[:, 2], "samples": b[:, 3], "seq_len": b[:, 4],
        "trigger": [TRIGGERS[t] for t in trig.tolist()],
        "trigger_s": trig_ns / 1e9, "decide_s": decide / 1e9,
        "issue_s": np.where(ran, issue / 1e9, np.nan), "done_s": np.where(ran, done / 1e9, np.nan),
        "dispatch_us": dispatch_us, "gap_us": gap_us, "host_ms": host_ms, "gpu_ms": gpu_ms,
        "status": ["failed" if r[11] else ("ok" if r[9] >= 0 else "not_run") for r in recs],
        "error": [r[12] for r in recs],
    }
    counted = decide >= t_warm
    late = np.array(driver.lateness, dtype=np.int64).reshape(-1, 3)
    late = late[late[:, 1] >= t_warm]  # wake-ups due after the warm-up
    arrival_late = late[late[:, 0] == _ARRIVAL, 2]
    timer_late = late[late[:, 0] == _TIMER, 2]
    arrival = result.requests.arrival_ns
    delivered = driver.delivered_ns[:len(arrival)]
    seen = (delivered >= 0) & (arrival >= t_warm)
    return {
        "issue_lateness_us": _stats(arrival_late / 1e3),
        "timer_lateness_us": _stats(timer_late / 1e3),
        "delivery_delay_us": _stats((delivered[seen] - arrival[seen]) / 1e3),
        "dispatch_us": _stats(dispatch_us[counted]),
        "completion_gap_us": _stats(gap_us[counted & (trig == _COMPLETION)]),
        "engine_host_ms": _stats(host_ms[counted]),
        "engine_gpu_ms": _stats(gpu_ms[counted]),
        "late_wakeups_over_100us": int((arrival_late > 100_000).sum() + (timer_late > 100_000).sum()),
        "steps": driver.steps, "decisions": driver.decisions,
        "failed_batches": len(driver.failures), "failures": driver.failures[:100],
        "batches": batches,
    }


def write_batches_csv(path, batches: dict) -> None:
    """DIR/batches.csv: one row per batch (see BATCH_COLUMNS), written atomically."""
    write_columns_csv(path, batches, BATCH_COLUMNS)


def write_live_outputs(out_dir, result: SimResult, request_id: np.ndarray, summary: dict, extra: dict,
                       info: dict, plot: bool = False, warmup_s: float = 0.0) -> list:
    """DIR/batches.csv and DIR/live.json, then requests.csv and summary.json (last) as ``schedsim run``.

    ``summary`` gets ``partial`` and a ``live`` section (lateness, dispatch overhead and
    engine timings); ``live.json`` holds those, ``info`` (backend, model, machine) and
    the failures.
    """
    from pathlib import Path

    from schedsim.files import write_json
    from schedsim.run.report import write_outputs

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").unlink(missing_ok=True)  # an old summary must not vouch for new files
    stats = {k: v for k, v in extra.items() if k != "batches"}
    summary["partial"] = bool(extra["partial"])
    if extra["partial"]:
        summary["partial_reason"] = extra["partial_reason"]
    summary["live"] = {k: stats[k] for k in ("issue_lateness_us", "timer_lateness_us", "dispatch_us",
                                             "completion_gap_us", "engine_host_ms", "engine_gpu_ms",
                                             "failed_batches")}
    path = out_dir / "batches.csv"
    write_batches_csv(path, extra["batches"])
    live_json = out_dir / "live.json"
    write_json(live_json, info | stats)
    return [path, live_json] + write_outputs(out_dir, result, request_id, summary, plot, warmup_s)
