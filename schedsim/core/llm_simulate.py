"""The simulation driver for LLM policies: one engine running one step after another.

Each step is one event: at its end the driver records the tokens it emitted, tells the
policy, delivers the requests that arrived meanwhile and asks for the next step. An idle
engine sleeps until the next arrival.

A decode-only step the policy marks repeatable (:attr:`Step.repeat`) is run as up to
that many identical steps in one event, stopping at the step during which the next
request arrives: the policy would have decided the same steps one by one, so the result
is the same, and a busy engine costs one event per arrival or finish instead of one per
token. Where the policy says arrivals would only wait (:attr:`Step.arrivals_wait`), the
run goes on past them: each is delivered at the end of the step during which it arrived
(:meth:`LLMPolicy.on_arrivals_in_run`), and the run stops there only if the policy says so.
A step that carries the decode run the policy would schedule after it (:attr:`Step.then`)
runs with that run in one event, logged as the two records deciding the run at the step's
end would give, unless a request arrives before the step ends. Times are integer nanoseconds.

With a policy that declares ``async_scheduling`` and a cost model that declares
``host_ns``, each step's host time overlaps the GPU time (vLLM's async scheduling: the
scheduler prepares step n+1 while step n runs): a step takes ``max(gpu, host)`` where it
took ``gpu + host``.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

import numpy as np

try:   # numpy 2
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:
    try:   # numpy 1.26
        from numpy.core.multiarray import _set_madvise_hugepage
    except ImportError:   # a numpy without the switch: its own default pages
        _set_madvise_hugepage = None

from schedsim.core.events import COMPLETION, DECISION, EventLoop, Scheduled
from schedsim.core.llm_results import (LLMResult, TokenTimes, apply_reject, count_type, step_token_sums,
                                       token_times)
from schedsim.core.llm_policy import Step, int_max
from schedsim.core.policy import NEVER, Reject, Requests
from schedsim.core.results import COMPLETED, QUEUED, RUNNING, PolicyError
from schedsim.cost.protocols import step_cost


def simulate_llm(requests: Requests, policy, cost, *, seed: int = 0, itl_from_ns: int = 0) -> LLMResult:
    """Replay ``requests`` against the LLM ``policy`` on one engine priced by ``cost``.

    ``cost`` is a :class:`~schedsim.cost.protocols.StepCost`, or any object with
    ``step_ns(num_tokens, context, swap_blocks)`` (then priced with no optional capability).

    ``itl_from_ns``: requests arriving before it (the warm-up) add no inter-token gaps to
    the pooled ITL, as they count in no other metric."""
    return _Driver(requests, policy, cost, seed, itl_from_ns).run()


class _Driver:
    def __init__(self, requests: Requests, policy, cost, seed: int, itl_from_ns: int = 0):
        n = len(requests)
        self.req, self.policy, self.cost, self.seed = requests, policy, cost, seed
        self.itl_from_ns = int(itl_from_ns)
        self.env = EventLoop()
        cost = self.cost = step_cost(cost)
        # Prices a repeated decode run-length encoded, where the cost model can (StepCostModel).
        self.decode_run_segments = cost.decode_run_segments
        # Async scheduling (vLLM prepares step n+1 while step n runs): a step's host time is
        # hidden behind the GPU time, up to it: a step takes max(gpu, host).
        self.host_ns = cost.host_ns if policy.async_scheduling else None
        # Speculative decoding: tokens per row of each step, and the draft proposer's time.
        self.emit_tokens: list | None = [] if policy.speculative is not None else None
        self.draft_ns = cost.draft_ns
        cost.begin_run()   # a cost model with state across steps (first calls) starts afresh
        self.n = n
        self.arrival_ns = requests.arrival_ns
        self.output_tokens = requests.output_tokens.astype(np.int64)
        self.status = np.full(n, QUEUED, dtype=np.int8)   # rejections; the rest at the end
        self.end_ns = np.full(n, -1, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.holds_responses = bool(policy.holds_responses)
        self.delivered = 0
        self.arrivals = self.arrival_ns.tolist() + [NEVER]   # scanned from `delivered`: the sentinel ends a scan
        self.next_arrival_ns = self.arrivals[0]
        # Per event: (start, end, end of its first step, repeats, rows, kv_blocks_used,
        # waiting, rows preempted) and its step's columns; the durations of repeated events.
        self.log: list[tuple] = []
        self.columns = _Columns(n)
        # Durations of the 2nd and later steps of each repeated event (its inter-token gaps),
        # run-length encoded in event order: price i repeats run_counts[i] times.
        self.run_prices: list[int] = []
        self.run_counts: list[int] = []
        self.in_flight: tuple[int, Step] | None = None   # (repeats, step) of the running event
        self.sleeping = False

    def run(self) -> LLMResult:
        self.policy.reset(self.req)
        # A policy that can replay the whole run compiled (paged-kv) hands back the log
        # this loop would have written; where it cannot, it answers None.
        replay = getattr(type(self.policy), "replay_compiled", None)   # (not a wrapper's forward)
        replayed = replay(self.policy, self.req, self.cost) if replay is not None else None
        if replayed is not None:
            self._take_replay(replayed)
        elif self.n:
            Scheduled(self.env, int(self.arrival_ns[0]), DECISION, self._on_wake)
        # A run allocates millions of small containers that die young, and makes almost no
        # reference cycles: the cyclic collector's passes over the growing log and policy
        # state would cost ~10% of the run. Anything cyclic is collected once it is over.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.env.run()
            with _small_pages():
                return self._result()
        finally:
            if was_enabled:
                gc.enable()

    # --- events ----------------------------------------------------------------------------

    def _on_wake(self, _event) -> None:
        self.sleeping = False
        self._next_step(self.env.now)

    def _on_step_end(self, _event) -> None:
        now = self.env.now
        repeats, step = self.in_flight
        self.policy.on_step_done(now, step, repeats)
        self._next_step(now)

    def _next_step(self, now: int) -> None:
        if self.next_arrival_ns <= now:
            arrivals, first = self.arrivals, self.delivered
            stop = first + 1
            while arrivals[stop] <= now:   # mostly one arrival: cheaper than a searchsorted
                stop += 1
            self.delivered, self.next_arrival_ns = stop, arrivals[stop]
            self.policy.on_arrivals(now, first, stop)
        step = self.policy.schedule(now)
        if type(step) is not Step and not isinstance(step, Step):
            raise PolicyError(f"{type(self.policy).__name__}.schedule returned {step!r}, not a Step")
        if step.rejects:
            for reject in step.rejects:
                apply_reject(self.policy, self.status, self.end_ns, self.delivered, now, reject)
        rows = step.rows
        if not rows.shape[0]:
            if self.next_arrival_ns < NEVER and not self.sleeping:
                self.sleeping = True   # idle until something arrives
                Scheduled(self.env, self.next_arrival_ns - now, DECISION, self._on_wake)
            return
        if not (step.num_tokens.shape == step.context.shape == step.emits.shape == rows.shape):
            raise PolicyError(f"{type(self.policy).__name__} returned a Step whose columns differ in length")
        if int_max(rows) >= self.delivered:
            raise PolicyError(f"{type(self.policy).__name__} scheduled rows that have not arrived: "
                              f"{rows[rows >= self.delivered][:8].tolist()}")
        if step.preempted.shape[0]:
            self.preemptions[step.preempted] += 1
        if step.repeat > 1:
            repeats, total, first = self._run(step, now)
        else:
            repeats = 1
            if step.verify_only:   # one decode row per token verified
                tokens = step.num_tokens.astype(np.int64)
                offsets = np.arange(int(tokens.sum())) - np.repeat(np.cumsum(tokens) - tokens, tokens)
                context = (np.repeat(step.context, tokens) + offsets).astype(np.int32)
                total = int(self.cost.step_ns(np.ones(context.shape[0], np.int32), context,
                                              step.swap_out_blocks + step.swap_in_blocks))
            else:
                total = int(self.cost.step_ns(step.num_tokens, step.context,
                                              step.swap_out_blocks + step.swap_in_blocks))
            first = total
            if step.draft_tokens and self.draft_ns is not None and step.emits.any():
                # The proposer drafts for every row that sampled, over its context after the step.
                after = (step.context + step.num_tokens)[step.emits]
                total = first = total + int(self.draft_ns(after, step.draft_tokens))
            if self.host_ns is not None:
                h = self.host_ns(rows.shape[0])
                total = first = max(total - h, h)
        # Token times are worked out from this log once the run is over (_result).
        self.log.append((now, now + total, now + first, repeats, rows.shape[0], step.kv_blocks_used,
                         step.waiting, step.preempted.shape[0]))
        self.columns.add(step)
        if self.emit_tokens is not None:
            self.emit_tokens.append(step.emits.astype(np.int32) if step.emit_tokens is None else step.emit_tokens)
        then = step.then
        if then is not None and repeats == 1 and self.next_arrival_ns > now + total:
            # The decode steps the policy would schedule next, nothing having arrived: run
            # at once, one record of their own, as if decided at this step's end.
            start = now + total
            more, run_total, then_first = self._run(then, start)
            self.log.append((start, start + run_total, start + then_first, more, then.rows.shape[0],
                             then.kv_blocks_used, then.waiting, 0))
            self.columns.add(then)
            if self.emit_tokens is not None:
                self.emit_tokens.append(then.emits.astype(np.int32))
            repeats += more
            total += run_total
        self.in_flight = (repeats, step)
        Scheduled(self.env, total, COMPLETION, self._on_step_end, None)

    def _run(self, step: Step, now: int) -> tuple[int, int, int]:
        """A repeatable decode step started at ``now``: (steps run, their total duration, the
        first one's), run until the step during which the next request arrives (or a later
        one where the policy lets the run go on past arrivals); records the gaps after its
        first step."""
        if int_max(step.num_tokens) != 1:
            raise PolicyError(f"{type(self.policy).__name__} marked a step repeatable that is "
                              f"not decode-only")
        repeats = int(step.repeat)
        if self.decode_run_segments is not None:
            counts, prices = self.decode_run_segments(step.context, repeats)
        else:   # a cost model with only the array form
            prices = self.cost.decode_run_ns(step.context, repeats).tolist()
            counts = [1] * repeats
        if self.host_ns is not None:
            h = self.host_ns(step.rows.shape[0])
            prices = [max(p - h, h) for p in prices]
        price = prices[0]
        if len(prices) == 1 and price > 0:
            # One price (most runs): where the run stops is a division, not an array.
            while self.next_arrival_ns < NEVER:
                # Stop after the step during which the next request arrives: the one
                # after it is decided with that request in view, unless it only
                # joins a queue that cannot move before the run ends.
                cut = (self.next_arrival_ns - now - 1) // price + 1
                if cut >= repeats:
                    break
                if not (step.arrivals_wait and self._arrive_in_run(now + cut * price)):
                    repeats = cut
                    break
            total = price * repeats
            if repeats > 1:
                self.run_prices.append(price)
                self.run_counts.append(repeats - 1)
        else:
            repeats, total = self._walk_segments(counts, prices, now, step.arrivals_wait)
        return repeats, total, price

    def _arrive_in_run(self, end_ns: int) -> bool:
        """Deliver the requests arrived by ``end_ns``, the end of a step of a run marked
        :attr:`Step.arrivals_wait`; whether the policy lets the run go on past them."""
        arrivals, first = self.arrivals, self.delivered
        stop = first + 1
        while arrivals[stop] <= end_ns:
            stop += 1
        self.delivered, self.next_arrival_ns = stop, arrivals[stop]
        return bool(self.policy.on_arrivals_in_run(end_ns, first, stop))

    def _walk_segments(self, counts: list, prices: list, now: int, arrivals_wait: bool) -> tuple[int, int]:
        """A run of several prices (a handful of segments): where it stops (after the step
        during which the next request arrives, or a later one where the policy lets the
        run go on past arrivals) and its total, walked in plain Python; records the gaps
        after its first step."""
        nxt = self.next_arrival_ns
        limit = nxt - now if nxt < NEVER else None
        taken = total = 0
        first = len(self.run_prices)
        last = len(counts) - 1
        for i, (c, p) in enumerate(zip(counts, prices)):
            stop = False
            while limit is not None and total + c * p >= limit:
                # The first step of this segment ending at or after limit (at least one).
                k = max(1, (limit - total + p - 1) // p) if p > 0 else 1
                if i == last and k == c:
                    break   # it arrives during the run's last step: nothing to cut
                if arrivals_wait and self._arrive_in_run(now + total + k * p):
                    nxt = self.next_arrival_ns
                    limit = nxt - now if nxt < NEVER else None
                    continue
                c, stop = k, True
                break
            self.run_prices.append(p)
            self.run_counts.append(c)
            taken += c
            total += c * p
            if stop:
                break
        self.run_counts[first] -= 1                # the first step's gap is not a repeat's
        return taken, total

    def _take_replay(self, replayed: dict) -> None:
        """The driver's state at the end of a compiled replay: its log, runs, counts, rejections."""
        self.log_array, self.log_summary = replayed["log"], replayed["log_summary"]
        self.run_prices, self.run_counts = replayed["run_prices"], replayed["run_counts"]
        self.preemptions = replayed["preemptions"]
        for row, ns in zip(replayed["rejected_rows"].tolist(), replayed["rejected_ns"].tolist()):
            apply_reject(self.policy, self.status, self.end_ns, self.n, ns,
                         Reject(np.array([row], np.int64), replayed["reject_reason"]))

    log_array: np.ndarray | None = None
    """The log as 8 rows (a field each) of one column per event, where a compiled replay wrote it."""
    log_summary = None
    """The replay's token times, per-step emitting rows and token sums from its log (given
    which requests are measured), where a compiled replay wrote the log."""

    def _result(self) -> LLMResult:
        n, name = self.n, type(self.policy).__name__
        measured = self.req.arrival_ns >= self.itl_from_ns  # warm-up requests add no gaps
        # Per record, the rows emitting in it (measured ones only where there is a warm-up),
        # and its tokens and prefill tokens.
        if self.log_array is None:
            nsteps = len(self.log)
            start, end, first_end, repeats, sizes, kv_blocks, waiting, preempted = (
                np.array(col, np.int64) for col in (zip(*self.log) if nsteps else [()] * 8))
            rows, tokens, emits = self.columns.arrays()
            rec = np.repeat(np.arange(nsteps, dtype=np.int32 if nsteps < 1 << 30 else np.int64), sizes)
            counts = None
            if self.emit_tokens is not None:
                counts = (np.concatenate(self.emit_tokens).astype(np.int64) if self.emit_tokens
                          else np.empty(0, np.int64))
            t = token_times(n, rows, rec, emits, start, first_end, end, repeats, counts)
            if measured.all():   # (record by record, without moving the log through rec)
                emitting = (np.add.reduceat(emits, np.cumsum(sizes) - sizes, dtype=count_type(emits)) if nsteps
                            else sizes)
            else:
                emitting = np.bincount(rec[emits & measured[rows]], minlength=nsteps)
            tok, pre = step_token_sums(tokens, sizes)
        else:   # the same arrays, worked out compiled from the replay's log
            nsteps = self.log_array.shape[1]
            start, end, first_end, repeats, sizes, kv_blocks, waiting, preempted = self.log_array
            *times, all_emitting, measured_emitting, tok, pre = self.log_summary(measured)
            t = TokenTimes(*times)
            emitting = all_emitting if measured.all() else measured_emitting
        first_seen, last_seen, tokens_out = t.first_seen, t.last_seen, t.tokens_out
        # Inter-token gaps: from a request's previous token to the first step of each record,
        # then each later step of a repeated record, once per request emitting in it.
        gaps = t.gaps_ns if measured.all() else t.gaps_ns[measured[t.gap_rows]]
        multi = np.flatnonzero(repeats > 1)
        run_ns = np.repeat(np.array(self.run_prices, np.int64), np.array(self.run_counts, np.int64))
        run_count = np.repeat(emitting[multi], repeats[multi] - 1).astype(np.int64, copy=False)
        keep = run_count > 0   # (each gap counts once: only a run's steps can count none)
        itl_ns = np.concatenate([gaps.astype(np.int64, copy=False), run_ns[keep]])
        itl_count = np.ones(itl_ns.shape[0], np.int64)
        itl_count[gaps.shape[0]:] = run_count[keep]

        stats = dict(self.policy.stats())
        hits = stats.pop("prefix_hit_tokens_per_request", None)
        # A request the policy stops short of its output_tokens (at the KV cache's or the
        # model's length limit) completes when it has emitted what the policy allowed.
        output = self.output_tokens
        limit = stats.pop("output_tokens_per_request", None)
        if limit is not None:
            output = np.minimum(output, np.asarray(limit, np.int64))
        if (tokens_out > output).any():
            raise PolicyError(f"{name} made a request emit more tokens than its output_tokens: "
                              f"rows {np.flatnonzero(tokens_out > output)[:8].tolist()}")
        done = (tokens_out == output) & (output > 0)
        if not self.holds_responses and (last_seen[done] > t.last_emit_rec[done]).any():
            raise PolicyError(f"{name} scheduled a request after it had emitted all its tokens")
        status = self.status
        rejected = status > COMPLETED
        if (rejected & (first_seen >= 0)).any():
            raise PolicyError(f"{name} ran a request it had rejected")
        status[(first_seen >= 0) & ~done] = RUNNING
        status[done] = COMPLETED
        end_ns = self.end_ns
        # A static batch answers its members together, at the end of its last step.
        finish = np.append(end, -1)[last_seen] if self.holds_responses else t.last_token_ns
        end_ns[done] = finish[done]

        return LLMResult(
            requests=self.req, status=status, scheduled_ns=t.scheduled_ns,
            first_token_ns=t.first_token_ns, end_ns=end_ns, tokens_out=tokens_out.astype(np.int32),
            preemptions=self.preemptions,
            prefix_hit_tokens=(np.zeros(n, np.int32) if hits is None else np.asarray(hits, np.int32)),
            itl_ns=itl_ns, itl_count=itl_count,
            step_start_ns=start, step_end_ns=end, step_repeats=repeats.astype(np.int32),
            step_seqs=sizes.astype(np.int32), step_tokens=tok.astype(np.int32),
            step_prefill_tokens=pre.astype(np.int32),
            step_kv_blocks=kv_blocks.astype(np.int32), step_waiting=waiting.astype(np.int32),
            step_preempted=preempted.astype(np.int32),
            kv_blocks_total=int(self.policy.kv_blocks_total), seed=self.seed,
            stats=stats)


@contextmanager
def _small_pages():
    """Arrays allocated meanwhile in ordinary pages, not transparent huge pages.

    numpy asks the kernel for huge pages for every array of 4 MB or more (``madvise``;
    numpy's global-state documentation, ``NUMPY_MADVISE_HUGEPAGE``). The result of a busy
    run allocates some thirty such arrays, each written once and freed soon after (the
    step log of the Azure conversation trace at 10x its rate holds 3.6M entries), and
    where memory is fragmented the kernel compacts it to find each huge page: on the
    2-core benchmark machine that made the result 0.46-1.16 s instead of 0.19-0.24 s (in
    turn in one process). Ordinary pages cost the same there every time. (``schedsim run``
    turns the advice off for its whole process, :func:`schedsim.cli.main._ordinary_pages`;
    this covers the simulator wherever else it runs: sweeps, plans, library calls.)"""
    if _set_madvise_hugepage is None:
        yield
        return
    was = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(was)


class _Columns:
    """``rows``, ``num_tokens`` and ``emits`` of every event's step, concatenated a chunk
    of events at a time while the arrays are fresh in memory: one concatenation of tens of
    thousands of small arrays spread over the heap at the end is several times slower.
    Rows are kept in 16 bits where the request numbers fit (a busy run logs millions)."""

    CHUNK = 1024

    def __init__(self, n: int):
        self.pending: tuple[list, list, list] = ([], [], [])
        self.chunks: tuple[list, list, list] = ([], [], [])
        self.dtypes = (np.uint16 if n <= 1 << 16 else np.int64, None, None)

    def add(self, step: Step) -> None:
        rows, tokens, emits = self.pending
        rows.append(step.rows)
        tokens.append(step.num_tokens)
        emits.append(step.emits)
        if len(rows) == self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        for part, chunks, dtype in zip(self.pending, self.chunks, self.dtypes):
            if part:
                chunks.append(np.concatenate(part, dtype=dtype, casting="unsafe") if dtype else np.concatenate(part))
                part.clear()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._flush()
        empty = (np.empty(0, self.dtypes[0]), np.empty(0, np.int32), np.empty(0, bool))
        return tuple(np.concatenate(chunks) if chunks else e for chunks, e in zip(self.chunks, empty))
