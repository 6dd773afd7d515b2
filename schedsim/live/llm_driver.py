"""The live driver for LLM policies: one real engine step per policy step, on the host clock.

The same policy objects as :mod:`schedsim.core.llm_simulate`, the same hooks in the same order
(the step's end, then arrivals, then ``schedule``), but a step lasts whatever
:class:`~schedsim.live.engines.llm_engine.PagedLLMEngine` takes to run it. The trace is replayed
open loop: request ``i`` becomes visible at ``t0 + arrival_ns[i]`` by the wall clock and its
latency counts from then (MLPerf LoadGen's rule, as :mod:`schedsim.live.driver`). One thread: the
loop asks for a step, runs it, tells the policy; an idle engine sleeps until the next
arrival (a timed sleep, then a short busy-wait). :attr:`Step.repeat` is ignored: the live
driver runs one step per call (``repeats=1``). With ``overlap`` (async scheduling) the
engine call runs on a worker thread while the loop tells the policy the step is done and
forms the next one (:meth:`_Driver._run_overlapped`); the decisions are the same, only
arrivals during a step that come after the next one was formed wait a step longer.

Speculative decoding (a policy with ``speculative``): the policy decides the rows, their
``1 + k`` tokens and how many drafts each accepts; the driver has a proposer write the
drafts (:mod:`schedsim.live.speculative`: a draft model on its own engine, or prompt
lookup), runs each verification as ``1 + k`` decode rows, and hands each row its accepted
drafts and then the target's token after them.

What the engine is given per row (:class:`~schedsim.live.engines.llm_engine.EngineRow`):

- **tokens**: a seeded random prompt of the request's ``input_tokens`` (prompts the trace
  describes by prefix-block hash ids, as Mooncake's, get the same tokens for the same id,
  so a prefix-cache hit reads the KV of the same tokens), then the tokens the engine
  generated greedily. Lengths come from the trace; nobody looks for EOS. A recomputed
  (preempted) request simply prefills its prompt and generated tokens again.
- **blocks**: a paging policy (``paged-kv``: it has a ``kv``
  :class:`~policies.kv_cache.KVCacheManager`) owns the block tables; the driver reads them
  with ``kv.blocks_of(row)`` after ``schedule``. When a step swaps requests out (``swap``
  preemption), the driver copies the victims' blocks (their tables as of their last step;
  a victim's table changes only in steps it runs in) to host memory before the step runs,
  and copies them back into the new blocks when the request is scheduled again. A
  reserving policy (``continuous``, LLM ``static``) holds no block tables: the driver keeps
  a :class:`~policies.kv_cache.KVCacheManager` of its own, as large as the policy's KV
  budget, allocates a request's blocks as its tokens are computed and frees them once it
  is done and out of the step. A static batch's padding rows (done members still computed,
  as FasterTransformer computes them) are decodes over their real context, as the simulator
  prices them: the driver allocates the slots they write like any decode's and keeps their
  blocks until the batch ends; only when the pool has no block left (a reservation smaller
  than the batch's longest request) does a padding row write past its blocks into the null
  block (``extra["padding_null_writes"]`` counts those row-steps).

The result is the simulator's :class:`~schedsim.core.llm_results.LLMResult` (every step
recorded with ``repeats=1``), so :mod:`schedsim.core.llm_metrics` and :mod:`schedsim.run.llm_report`
work unchanged. ``extra`` holds the per-step engine timings (CUDA-event GPU time, host time
around the engine call, time to form the step, swap copies) and their summaries.

An engine error in a step fails that step's requests (status FAILED, the reason kept),
and the run goes on: the policy is told the step ran (so its state stays consistent) and
failed requests are left out of later engine calls. Ctrl-C, ``stop`` or ``time_limit_s``
end the run early: the result then holds the requests scheduled so far, marked partial.

Imports neither simpy nor pyarrow (the device image may have neither).
"""

from __future__ import annotations

import gc
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from schedsim.live.engines.llm_rows import EngineRow
from schedsim.live.llm_warmup import policy_max_seqs, warm_rows, engine_context, warm_up, warmup_prefill_tokens
from schedsim.core.llm_results import LLMResult, apply_reject, step_token_sums, token_times
from schedsim.core.llm_policy import Step
from schedsim.core.policy import NEVER, Requests
from schedsim.core.results import COMPLETED, FAILED, QUEUED, RUNNING, PolicyError

STEP_COLUMNS = ("step", "start_s", "issue_s", "end_s", "n_rows", "tokens", "prefill_rows", "prefill_tokens",
                "prefill_attention", "prefill_context", "decode_rows", "decode_max_context", "decode_kv_tokens", "graph",
                "schedule_us", "swap_ms", "engine_ms", "gpu_ms", "host_ms", "status", "error", "draft_ms",
                "overlap_ms")
"""Columns of the live step table (DIR/live_steps.csv); times in s from the trace start.

The step's composition, over the rows the engine ran (what the step cost model of
:mod:`schedsim.cost.step_model` prices): ``n_rows``, ``tokens``; prefill rows (more than one
token, ``q`` tokens over ``c`` cached): ``prefill_rows``, ``prefill_tokens`` (sum of q),
``prefill_attention`` (sum of ``q * c + q * (q + 1) // 2``), ``prefill_context`` (sum of
c); decodes: ``decode_rows``, ``decode_max_context`` (their longest c, -1 if none) and
``decode_kv_tokens`` (the sum of their c + 1: the keys each attends over);
``graph``: the engine replayed a CUDA graph.

``schedule_us``: from the step's start (before ``schedule``) to the engine call (forming
the step, block tables, swaps; the draft model's time left out); overlapped (async
scheduling): forming the step alone; ``engine_ms``: the engine call, wall; ``gpu_ms``: its
CUDA events (NaN on the CPU); ``host_ms``: ``end - start - gpu - draft``, everything in the
step that is neither GPU time nor drafting (overlapped: from the later of its start and the
step before's end). ``draft_ms``: speculative decoding's proposer, wall (0 without);
``overlap_ms``: the part of forming this step that ran while the step before was still
running (async scheduling; 0 in series). A verification of ``1 + k`` tokens counts as the
``1 + k`` decode rows the engine runs."""


class PromptTokens:
    """Every request's token ids: a seeded prompt, then what the engine generates.

    Token ``p`` of a prompt with prefix-block hash ids lies in hash block ``p //
    hash_block_tokens`` and is drawn from a generator seeded by (seed, that id); other
    prompt tokens come from one seeded by (seed, row). Buffers grow when a static batch's
    padding rows compute past their output.
    """

    def __init__(self, requests: Requests, vocab: int, seed: int = 0):
        self.req, self.vocab, self.seed = requests, int(vocab), int(seed)
        self.buf: list[np.ndarray | None] = [None] * len(requests)
        self.length = [0] * len(requests)

    def _prompt(self, r: int) -> np.ndarray:
        req = self.req
        p, o = int(req.input_tokens[r]), int(req.output_tokens[r])
        buf = np.empty(p + o + 1, np.int64)
        lo = 1 if self.vocab > 2 else 0
        filled = 0
        if req.hash_ids is not None:
            per = int(req.hash_block_tokens)
            ids = req.hash_ids[req.hash_offsets[r]:req.hash_offsets[r + 1]].tolist()
            for h in ids:
                if filled >= p:
                    break
                k = min(per, p - filled)
                g = np.random.default_rng([self.seed, 1, int(h) & 0x7FFFFFFFFFFFFFFF])
                buf[filled:filled + k] = g.integers(lo, self.vocab, size=per)[:k]
                filled += k
        if filled < p:
            g = np.random.default_rng([self.seed, 2, r])
            buf[filled:p] = g.integers(lo, self.vocab, size=p - filled)
        return buf

    def get(self, r: int, start: int, n: int) -> np.ndarray:
        buf = self.buf[r]
        if buf is None:
            buf = self.buf[r] = self._prompt(r)
            self.length[r] = int(self.req.input_tokens[r])
        if start + n > self.length[r]:
            raise PolicyError(f"row {r}: a step computes tokens {start}..{start + n - 1}, but the "
                              f"request has {self.length[r]} tokens so far")
        return buf[start:start + n]

    def known(self, r: int) -> int:
        """Tokens of request ``r`` so far: its prompt, then what it generated."""
        if self.buf[r] is None:
            self.get(r, 0, 0)
        return self.length[r]

    def append(self, r: int, token: int) -> None:
        buf, n = self.buf[r], self.length[r]
        if n == buf.shape[0]:
            buf = self.buf[r] = np.concatenate([buf, np.empty(max(n // 2, 16), np.int64)])
        buf[n] = token
        self.length[r] = n + 1

    def tokens(self, r: int) -> np.ndarray:
        """All tokens of request ``r`` so far (prompt, then generated; a copy)."""
        return self.buf[r][:self.length[r]].copy() if self.buf[r] is not None else np.empty(0, np.int64)


def composition(ntok: list, ctx: list, live: list | None = None) -> tuple:
    """(n_rows, tokens, prefill_rows, prefill_tokens, prefill_attention, prefill_context,
    decode_rows, decode_max_context, decode_kv_tokens) of a step's rows ``live`` (all when None); see
    :data:`STEP_COLUMNS`."""
    idx = range(len(ntok)) if live is None else live
    tokens = pre_rows = pre_tokens = attention = pre_ctx = dec = kv = 0
    dmax = -1
    for i in idx:
        q, c = int(ntok[i]), int(ctx[i])
        tokens += q
        if q > 1:
            pre_rows += 1
            pre_tokens += q
            attention += q * c + q * (q + 1) // 2
            pre_ctx += c
        else:
            dec += 1
            dmax = max(dmax, c)
            kv += c + 1
    return len(idx), tokens, pre_rows, pre_tokens, attention, pre_ctx, dec, dmax, kv


def _stats(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not x.size:
        return {"n": 0}
    return {"n": int(x.size), "mean": float(x.mean()), "std": float(x.std()),
            "p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99)),
            "min": float(x.min()), "max": float(x.max()), "sum": float(x.sum())}


def check_engine_for(policy, engine) -> None:
    """ValueError when ``engine`` cannot serve ``policy``'s blocks (block size, pool size)."""
    bs = policy.block_size
    if bs is not None and int(bs) != engine.block_size:
        raise ValueError(f"the policy's block size {bs} differs from the engine's {engine.block_size}")
    budget = policy.budget
    if budget is not None and budget.num_blocks > engine.num_blocks:
        raise ValueError(f"the policy manages {budget.num_blocks} KV blocks, the engine holds "
                         f"{engine.num_blocks}")


_NO_DRAFTS: dict = {}


@dataclass(eq=False, slots=True)
class _Formed:
    """One step on its way through the loop: formed, launched, finished."""

    start: int
    """When forming began (ns from the trace start)."""
    step: Step
    rows: list
    ntok: list
    ctx: list
    live: list = ()
    """Indices of the rows whose requests have not failed."""
    tables: list | None = None
    error: str = ""
    formed: int = 0
    prepared: object = None
    """The engine's packed inputs when packed while the step before ran."""
    patch: list = ()
    """(token index, row, position) of the placeholders in ``prepared``."""
    drafts: dict = field(default_factory=lambda: _NO_DRAFTS)
    """Row index -> draft token ids of each verifying row (never mutated: replaced)."""
    engine_rows: list | None = None
    """(tokens, context) of each engine row, where they differ from the step's rows."""
    draft_ms: float = 0.0
    swap_ms: float = 0.0
    issue: int = 0
    t_engine: int = 0
    end: int = 0
    out: np.ndarray | None = None
    gpu_ms: float = math.nan
    graph: bool = False
    exc: BaseException | None = None
    future: object = None
    overlapped_ns: int = 0


class _Driver:
    def __init__(self, requests: Requests, policy, engine, *, seed: int, spin_ns: int, clock,
                 draft=None, overlap: bool = False):
        from policies.kv_cache import KVCacheManager
        from schedsim.live.speculative import proposer_for

        n = len(requests)
        self.overlap = bool(overlap)
        self.proposer = proposer_for(policy.speculative, draft)
        self.draft_done = [0] * n   # tokens of each request whose draft-model KV is written
        self.req, self.policy, self.engine, self.n = requests, policy, engine, n
        self.clock, self.spin_ns = clock, int(spin_ns)
        self.t0 = 0
        self.arrival_ns = requests.arrival_ns
        self.output = requests.output_tokens.astype(np.int64)
        self.limit = (requests.input_tokens.astype(np.int64) + self.output).tolist()
        self.status = np.full(n, QUEUED, dtype=np.int8)
        self.end_ns = np.full(n, -1, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.delivered_ns = np.full(n, -1, dtype=np.int64)
        self.failed_ns = np.full(n, -1, dtype=np.int64)
        self.failures: list[dict] = []
        self.holds_responses = bool(policy.holds_responses)
        self.delivered = 0
        self.next_arrival_ns = int(self.arrival_ns[0]) if n else NEVER
        self.tokens = PromptTokens(requests, engine.cfg.vocab, seed)
        self.emitted = [0] * n
        self.records: list[tuple[int, int, Step]] = []
        self.timing: list[list] = []          # STEP_COLUMNS per record
        self.lateness: list[int] = []         # ns late per timed wake-up for an arrival
        kv = policy.kv
        self.paged = isinstance(kv, KVCacheManager)
        self.kv = kv if self.paged else KVCacheManager(
            engine.num_blocks if policy.budget is None else int(policy.budget.num_blocks),
            engine.block_size)
        self.last_table: dict[int, list[int]] = {}
        self.handles: dict = {}               # row -> SwapHandle while swapped out
        self.done_holding: set[int] = set()   # own blocks: done requests still holding blocks
        self.padding_null_writes = 0          # padding rows' writes that fell into the null block
        self.swaps = {"out_blocks": 0, "in_blocks": 0, "out_ms": 0.0, "in_ms": 0.0, "requests_swapped": 0}
        self.swapped_rows: set[int] = set()

    def now(self) -> int:
        return self.clock() - self.t0

    # --- the loop --------------------------------------------------------------------------

    def run(self, deadline_ns: int, stop: threading.Event | None) -> str | None:
        """Steps until the trace is done; returns why it stopped early, if it did."""
        if self.overlap:
            return self._run_overlapped(deadline_ns, stop)
        while True:
            start = self.now()
            if start >= deadline_ns:
                return "time limit"
            if stop is not None and stop.is_set():
                return "stopped"
            step = self._next(start)
            if step is None:
                if self.next_arrival_ns >= NEVER:
                    return None
                if self._sleep_until(min(self.next_arrival_ns, deadline_ns), stop):
                    self.lateness.append(self.now() - self.next_arrival_ns)
                continue
            f = self._form(start, step, stage=False)
            self._launch(f, None)
            self._finish(f)
            self.policy.on_step_done(f.end, step, 1)

    def _run_overlapped(self, deadline_ns: int, stop: threading.Event | None) -> str | None:
        """The loop under async scheduling: while step n runs on a worker thread, the policy
        is told it is done (it counts tokens, it needs no token ids), forms step n + 1 and
        its block tables, and the engine packs its inputs, with the tokens step n will
        generate as placeholders written in once it ends (:meth:`_launch`). Arrivals during
        step n after step n + 1 was formed wait for step n + 2, as in vLLM."""
        from concurrent.futures import ThreadPoolExecutor

        inflight = None
        with ThreadPoolExecutor(1, thread_name_prefix="schedsim-engine") as worker:
            try:
                while True:
                    start = self.now()
                    if start >= deadline_ns or (stop is not None and stop.is_set()):
                        return "time limit" if start >= deadline_ns else "stopped"
                    step = self._next(start)
                    if step is None:
                        if inflight is not None:
                            self._finish(inflight)
                            inflight = None
                            continue
                        if self.next_arrival_ns >= NEVER:
                            return None
                        if self._sleep_until(min(self.next_arrival_ns, deadline_ns), stop):
                            self.lateness.append(self.now() - self.next_arrival_ns)
                        continue
                    f = self._form(start, step, stage=inflight is not None)
                    if inflight is not None:
                        self._finish(inflight)
                        f.overlapped_ns = max(0, min(f.formed, inflight.t_engine) - start)
                    self._launch(f, worker)
                    inflight = f
                    self.policy.on_step_done(self.now(), step, 1)
            finally:
                if inflight is not None:
                    self._finish(inflight)

    def _next(self, start: int) -> Step | None:
        """Deliver what arrived by ``start``, ask the policy for a step, apply its rejects;
        None when it has nothing to run."""
        policy = self.policy
        if self.next_arrival_ns <= start:
            self._deliver(start)
        step = policy.schedule(start)
        if type(step) is not Step and not isinstance(step, Step):
            raise PolicyError(f"{type(policy).__name__}.schedule returned {step!r}, not a Step")
        for reject in step.rejects:
            apply_reject(self.policy, self.status, self.end_ns, self.delivered, start, reject)
        if not step.rows.shape[0]:
            return None
        self._check(step)
        return step

    def _sleep_until(self, target: int, stop) -> bool:
        """Sleep (then busy-wait the last ``spin_ns``) until ``target``; False if stopped first."""
        while True:
            left = target - self.now()
            if left <= 0:
                return True
            if stop is not None and stop.is_set():
                return False
            if left > self.spin_ns:
                time.sleep(min(left - self.spin_ns, 200_000_000) / 1e9)
                continue
            end = target + self.t0
            while self.clock() < end:
                pass
            return True

    def _deliver(self, now: int) -> None:
        stop = int(self.arrival_ns.searchsorted(now, side="right"))
        first, self.delivered = self.delivered, stop
        self.next_arrival_ns = int(self.arrival_ns[stop]) if stop < self.n else NEVER
        self.delivered_ns[first:stop] = now
        self.policy.on_arrivals(now, first, stop)

    def _check(self, step: Step) -> None:
        name = type(self.policy).__name__
        rows = step.rows
        if not (step.num_tokens.shape == step.context.shape == step.emits.shape == rows.shape):
            raise PolicyError(f"{name} returned a Step whose columns differ in length")
        if int(rows.max()) >= self.delivered:
            raise PolicyError(f"{name} scheduled rows that have not arrived: "
                              f"{rows[rows >= self.delivered][:8].tolist()}")

    def _form(self, start: int, step: Step, stage: bool) -> "_Formed":
        """Block tables and the rows' known tokens; with ``stage``, the engine's packed inputs
        too (the tokens the running step will generate as placeholders, :attr:`_Formed.patch`)."""
        rows = step.rows.tolist()
        f = _Formed(start, step, rows, step.num_tokens.tolist(), step.context.tolist())
        if step.preempted.shape[0]:
            self.preemptions[step.preempted] += 1
            for v in step.preempted.tolist():
                self.draft_done[v] = 0   # its blocks change: the draft's KV is gone
        f.live = ([i for i, r in enumerate(rows) if self.failed_ns[r] < 0] if self.failures
                  else list(range(len(rows))))
        try:
            f.tables = self._tables(rows, f.ntok, f.ctx)
        except (KeyboardInterrupt, PolicyError):
            raise
        except Exception as exc:  # noqa: BLE001 - the driver's own KV pool is full: fail the step
            self._fail(f, exc)
        # Emitted tokens counted now (the policy counts them at on_step_done): the next step's
        # tables free the blocks of requests done here (reserving policies).
        counts = step.emit_tokens.tolist() if step.emit_tokens is not None else None
        emitted = self.emitted
        for i, e in enumerate(step.emits.tolist()):
            if e:
                r = rows[i]
                emitted[r] += counts[i] if counts is not None else 1
                if not self.paged and emitted[r] >= self.output[r]:
                    self.done_holding.add(r)
        if stage and not f.error and self.proposer is None:
            f.prepared, f.patch = self._stage(f)
        f.formed = self.now()
        return f

    def _stage(self, f: "_Formed"):
        """Pack ``f``'s rows now, tokens not generated yet as 0; returns (packed, patch list)."""
        tokens, patch, engine_rows, at = self.tokens, [], [], 0
        for i in f.live:
            r, c, n = f.rows[i], f.ctx[i], f.ntok[i]
            have = max(0, min(n, tokens.known(r) - c))
            ids = np.zeros(n, np.int64)
            if have:
                ids[:have] = tokens.get(r, c, have)
            patch += [(at + j, r, c + j) for j in range(have, n)]
            engine_rows.append(EngineRow(ids, c, f.tables[i]))
            at += n
        return (self.engine.prepare(engine_rows) if engine_rows else None), patch

    def _launch(self, f: "_Formed", worker) -> None:
        """Swaps, drafts and the engine call: on ``worker`` (a thread) when given, else here."""
        if f.error:
            f.issue = f.t_engine = self.now()
            return
        engine, tokens = self.engine, self.tokens
        if self.failures:
            live = [i for i in f.live if self.failed_ns[f.rows[i]] < 0]
            if live != f.live:   # the step before failed some of its requests
                f.live, f.prepared = live, None
        try:
            f.swap_ms = self._swap(f.step)
            if f.prepared is not None:
                if f.patch:
                    idx, r, pos = zip(*f.patch)
                    engine.set_tokens(f.prepared, list(idx), [tokens.get(a, b, 1)[0] for a, b in zip(r, pos)])
                prepared = f.prepared
            else:
                if self.proposer is not None:
                    t = self.now()
                    f.drafts = self.proposer.propose(f.rows, f.ntok, f.ctx, f.live, f.tables, tokens, self.draft_done)
                    f.draft_ms = (self.now() - t) / 1e6
                drafts, fr, fc, fn, ft = f.drafts, f.rows, f.ctx, f.ntok, f.tables
                if not drafts:
                    rows = [EngineRow(tokens.get(fr[i], fc[i], fn[i]), fc[i], ft[i]) for i in f.live]
                else:
                    rows = []
                    for i in f.live:
                        r, c, n = fr[i], fc[i], fn[i]
                        d = drafts.get(i)
                        if d is None:
                            rows.append(EngineRow(tokens.get(r, c, n), c, ft[i]))
                        else:   # a verification: one decode row per token (the last known, then the drafts)
                            ids = np.concatenate([tokens.get(r, c, 1), d])
                            rows += [EngineRow(ids[j:j + 1], c + j, ft[i]) for j in range(n)]
                    f.engine_rows = [(len(e.tokens), e.context) for e in rows]
                prepared = None if not rows else (engine.prepare(rows) if worker is not None else rows)
        except (KeyboardInterrupt, PolicyError):
            raise
        except Exception as exc:  # noqa: BLE001 - an engine error fails this step's requests
            self._fail(f, exc)
            f.issue = f.t_engine = self.now()
            return
        f.issue = self.now()
        if prepared is None:
            f.t_engine = f.issue
            return
        if worker is None:
            self._call(f, engine.execute, prepared)
        else:
            f.future = worker.submit(self._call, f, engine.run, prepared)

    def _call(self, f: "_Formed", call, arg) -> None:
        try:
            f.out = call(arg)
            f.gpu_ms, f.graph = float(self.engine.last_gpu_ms), bool(self.engine.last_graph)
        except (KeyboardInterrupt, PolicyError):
            raise
        except Exception as exc:  # noqa: BLE001 - an engine error fails this step's requests
            f.exc = exc
        f.t_engine = self.now()

    def _fail(self, f: "_Formed", exc: BaseException) -> None:
        t = self.now()
        f.error = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        failed = [f.rows[i] for i in f.live]
        self.failed_ns[failed] = t
        self.failures.append({"step": len(self.records), "error": f.error, "rows": failed[:64]})

    def _finish(self, f: "_Formed") -> None:
        """Wait for the step's engine call, hand its tokens to the requests, log it."""
        if f.future is not None:
            f.future.result()
            f.future = None
        if f.exc is not None:
            self._fail(f, f.exc)
        f.end = end = self.now()
        tokens, out = self.tokens, f.out
        if out is not None and not f.drafts:
            rows, ctx, ntok, length = f.rows, f.ctx, f.ntok, tokens.length
            for k, i in enumerate(f.live):
                r = rows[i]
                if ctx[i] + ntok[i] == length[r]:   # the row's next token (padding rows too)
                    tokens.append(r, int(out[k]))
        elif out is not None:
            k = 0
            counts = f.step.emit_tokens
            for i in f.live:
                r = f.rows[i]
                d = f.drafts.get(i)
                if d is None:
                    if f.ctx[i] + f.ntok[i] == tokens.length[r]:   # the row's next token (padding rows too)
                        tokens.append(r, int(out[k]))
                    k += 1
                    continue
                # Verified: the accepted drafts (as many as the policy drew), then the target's
                # token after them; the draft's KV holds the accepted ones.
                t = int(counts[i])
                known = tokens.length[r]
                for tok in d[:t - 1].tolist():
                    tokens.append(r, tok)
                tokens.append(r, int(out[k + t - 1]))
                self.draft_done[r] = known + min(t - 1, len(d) - 1)
                k += f.ntok[i]
        begin = f.start if not self.records else max(f.start, self.records[-1][1])
        self.records.append((begin, end, f.step))
        comp = composition(*zip(*f.engine_rows)) if f.engine_rows else composition(f.ntok, f.ctx, f.live)
        gpu = f.gpu_ms if math.isfinite(f.gpu_ms) else 0.0
        self.timing.append([len(self.timing), f.start, f.issue, end, *comp, f.graph,
                            (f.formed - f.start) / 1e3 if self.overlap else (f.issue - f.start) / 1e3 - f.draft_ms * 1e3,
                            f.swap_ms, (f.t_engine - f.issue) / 1e6, f.gpu_ms,
                            (end - begin) / 1e6 - gpu - f.draft_ms,
                            "failed" if f.error else "ok", f.error, f.draft_ms, f.overlapped_ns / 1e6])

    # --- blocks ----------------------------------------------------------------------------

    def _tables(self, rows: list, ntok: list, ctx: list) -> list:
        kv = self.kv
        if self.paged:
            tables = [kv.blocks_of(r) for r in rows]
            for r, t in zip(rows, tables):
                self.last_table[r] = t
            return tables
        if self.done_holding:
            present = set(rows)
            for r in [r for r in self.done_holding if r not in present]:
                kv.free(r)
                self.done_holding.discard(r)
        bs = kv.block_size
        padding = []
        for r, n, c in zip(rows, ntok, ctx):
            need = c + n
            real = min(need, self.limit[r])   # a static batch's padding rows compute past their output
            if kv.allocate(r, real) is None:
                raise RuntimeError(f"row {r}: the driver's KV pool ({kv.usable_blocks} blocks) has no room "
                                   f"for {real} tokens: the policy's reservations exceed its budget")
            if need > real:
                padding.append((r, need))
        if padding:
            # Padding rows decode over their real context in blocks of their own, from the blocks
            # the step's members will not need for their real tokens (padding never starves them).
            spare = kv.num_free_blocks - sum(max(0, -(-self.limit[r] // bs) - len(kv.blocks_of(r))) for r in rows)
            for r, need in padding:
                take = min(-(-need // bs) - len(kv.blocks_of(r)), spare)
                if take > 0:
                    kv.allocate(r, min(need, (len(kv.blocks_of(r)) + take) * bs))
                    spare -= take
        tables = []
        for r, n, c in zip(rows, ntok, ctx):
            t = kv.blocks_of(r)
            short = -(-(c + n) // bs) - len(t)
            if short > 0:
                self.padding_null_writes += 1 if c // bs >= len(t) else 0
                t = t + [0] * short
            tables.append(t)
        return tables

    def _swap(self, step: Step) -> float:
        """Copy swapped-out victims' blocks to the host and swapped-in ones back; ms taken."""
        if not self.paged or not (step.swap_out_blocks or step.swap_in_blocks or self.handles):
            return 0.0
        kv, engine = self.kv, self.engine
        t = time.perf_counter()
        moved = 0
        for v in step.preempted.tolist():
            if kv.is_swapped(v) and v not in self.handles:
                blocks = self.last_table.pop(v)
                self.handles[v] = engine.swap_out(blocks)
                self.swapped_rows.add(v)
                moved += len(blocks)
        if moved != step.swap_out_blocks:
            raise PolicyError(f"{type(self.policy).__name__}: the step swaps out {step.swap_out_blocks} "
                              f"blocks, its victims held {moved}")
        t_out = time.perf_counter()
        back = 0
        for r in step.rows.tolist():
            h = self.handles.get(r)
            if h is not None and kv.holds(r):
                engine.swap_in(h, kv.blocks_of(r)[:h.num_blocks])
                del self.handles[r]
                back += h.num_blocks
        if back != step.swap_in_blocks:
            raise PolicyError(f"{type(self.policy).__name__}: the step swaps in {step.swap_in_blocks} "
                              f"blocks, the driver copied {back}")
        t_in = time.perf_counter()
        s = self.swaps
        s["out_blocks"] += moved
        s["in_blocks"] += back
        s["out_ms"] += (t_out - t) * 1e3
        s["in_ms"] += (t_in - t_out) * 1e3
        s["requests_swapped"] = len(self.swapped_rows)
        return (t_in - t) * 1e3

    # --- the result ------------------------------------------------------------------------

    def result(self, keep: int, itl_from_ns: int = 0) -> LLMResult:
        n, name = self.n, type(self.policy).__name__
        recs = self.records
        nsteps = len(recs)
        start = np.fromiter((r[0] for r in recs), np.int64, nsteps)
        end = np.fromiter((r[1] for r in recs), np.int64, nsteps)
        steps = [r[2] for r in recs]
        sizes = np.fromiter((len(st) for st in steps), np.int64, nsteps)
        empty_i, empty_b = np.empty(0, np.int64), np.empty(0, bool)
        rows = np.concatenate([st.rows for st in steps]) if steps else empty_i
        rec = np.repeat(np.arange(nsteps), sizes)
        emits = np.concatenate([st.emits for st in steps]) if steps else empty_b
        ntok = np.concatenate([st.num_tokens for st in steps]).astype(np.int64) if steps else empty_i

        ones = np.ones(nsteps, np.int64)
        counts = None
        if self.policy.speculative is not None and steps:   # tokens each row emitted (speculative)
            counts = np.concatenate([st.emits.astype(np.int64) if st.emit_tokens is None
                                     else st.emit_tokens.astype(np.int64) for st in steps])
        t = token_times(n, rows, rec, emits, start, end, end, ones, counts)   # one step per record, live
        first_seen, last_seen, tokens_out = t.first_seen, t.last_seen, t.tokens_out
        itl_ns = t.gaps_ns[self.req.arrival_ns[t.gap_rows] >= itl_from_ns]  # warm-up requests add no gaps

        stats = dict(self.policy.stats())
        hits = stats.pop("prefix_hit_tokens_per_request", None)
        output = self.output   # less where the policy stops a request at a length limit
        limit = stats.pop("output_tokens_per_request", None)
        if limit is not None:
            output = np.minimum(output, np.asarray(limit, np.int64))
        if (tokens_out > output).any():
            raise PolicyError(f"{name} made a request emit more tokens than its output_tokens: "
                              f"rows {np.flatnonzero(tokens_out > output)[:8].tolist()}")
        done = (tokens_out == output) & (output > 0)
        status = self.status.copy()
        if ((status > COMPLETED) & (first_seen >= 0)).any():
            raise PolicyError(f"{name} ran a request it had rejected")
        status[(first_seen >= 0) & ~done] = RUNNING
        status[done] = COMPLETED
        end_ns = self.end_ns.copy()
        finish = np.append(end, -1)[last_seen] if self.holds_responses else t.last_token_ns
        end_ns[done] = finish[done]
        failed = self.failed_ns >= 0
        status[failed] = FAILED
        end_ns[failed] = self.failed_ns[failed]

        tok, pre = step_token_sums(ntok, sizes)
        hits = np.zeros(n, np.int32) if hits is None else np.asarray(hits, np.int32)
        req = self.req if keep == n else self.req.head(keep)
        k = slice(0, keep)
        return LLMResult(
            requests=req, status=status[k], scheduled_ns=t.scheduled_ns[k], first_token_ns=t.first_token_ns[k],
            end_ns=end_ns[k], tokens_out=tokens_out[k].astype(np.int32), preemptions=self.preemptions[k],
            prefix_hit_tokens=hits[k], itl_ns=itl_ns, itl_count=np.ones(itl_ns.size, np.int64),
            step_start_ns=start, step_end_ns=end, step_repeats=np.ones(nsteps, np.int32),
            step_seqs=sizes.astype(np.int32), step_tokens=tok.astype(np.int32),
            step_prefill_tokens=pre.astype(np.int32),
            step_kv_blocks=np.fromiter((st.kv_blocks_used for st in steps), np.int32, nsteps),
            step_waiting=np.fromiter((st.waiting for st in steps), np.int32, nsteps),
            step_preempted=np.fromiter((st.preempted.shape[0] for st in steps), np.int32, nsteps),
            kv_blocks_total=int(self.policy.kv_blocks_total), seed=0, stats=stats,
            meta={"driver": "live"})


def run_live_llm(requests: Requests, policy, engine, *, time_limit_s: float | None = None,
                 warmup_s: float = 0.0, engine_warmup: bool = True, seed: int = 0, spin_us: float = 50.0,
                 stop: threading.Event | None = None, start_delay_s: float = 0.05,
                 keep_tokens: bool = False, clock=time.perf_counter_ns, draft=None,
                 overlap: bool = False) -> tuple[LLMResult, dict]:
    """Replay ``requests`` in real time against the LLM ``policy`` on an open ``engine``.

    ``engine`` is an entered :class:`~schedsim.live.engines.llm_engine.PagedLLMEngine` (or one
    with its ``execute``/``swap_out``/``swap_in``/``last_gpu_ms`` interface) whose pool holds
    at least the policy's KV blocks. ``engine_warmup`` runs and captures the step shapes
    before the clock starts (:func:`~schedsim.live.llm_warmup.warm_up`). ``warmup_s`` selects the steps the returned
    timing summaries count and leaves the inter-token gaps of requests arriving before it
    out of the result's ITL (:func:`~schedsim.core.llm_metrics.summarize_llm` leaves out those
    requests the same way). ``seed`` seeds the prompts. ``spin_us``: busy-wait this long
    before an idle engine's wake-up. ``time_limit_s`` (from the trace start), ``stop`` and
    Ctrl-C end the run early: the step in flight finishes (Ctrl-C: is dropped) and the
    result holds the requests scheduled so far (``extra["partial"]`` says why).

    ``draft``: an entered draft engine (:func:`~schedsim.live.engines.llm_engine.draft_engine`)
    for a policy running speculative decoding with a model proposer
    (:mod:`schedsim.live.speculative`; ``ngram`` and ``suffix`` need none). ``overlap``: run
    as async scheduling does, forming each step while the one before runs on a worker
    thread (:meth:`_Driver._run_overlapped`; the engine needs ``prepare``, ``run`` and
    ``set_tokens``); False: one step after another.

    Returns the :class:`LLMResult` and ``extra``: per-step timings (``extra["steps"]``,
    :data:`STEP_COLUMNS`), their summaries, swap totals, lateness and failures; with
    ``keep_tokens``, ``extra["tokens"]`` (a :class:`PromptTokens`: every request's prompt
    and generated token ids).
    """
    from schedsim.live.driver import timer_slack

    n = len(requests)
    policy.reset(requests)
    check_engine_for(policy, engine)
    if draft is not None:
        check_engine_for(policy, draft)
    if overlap and not all(hasattr(engine, a) for a in ("prepare", "run", "set_tokens")):
        raise ValueError(f"overlap=True needs an engine with prepare, run and set_tokens; "
                         f"{type(engine).__name__} has not")
    setup = {"engine_warmup_s": 0.0, "warmup_decode_shapes": 0, "warmup_eager_s": 0.0, "warmup_eager_steps": 0}
    if engine_warmup:
        setup = warm_up(engine, max_seqs=warm_rows(policy),
                        max_context=min(engine_context(requests, policy), engine.max_context),
                        prefill_tokens=warmup_prefill_tokens(requests, policy))
        if draft is not None:
            warm = warm_up(draft, max_seqs=policy_max_seqs(policy, 256),
                           max_context=min(engine_context(requests, policy), draft.max_context),
                           prefill_tokens=warmup_prefill_tokens(requests, policy))
            setup["draft_warmup_s"] = warm["engine_warmup_s"]
        policy.reset(requests)   # fresh state after the warm-up's wall time
    driver = _Driver(requests, policy, engine, seed=seed, spin_ns=int(spin_us * 1000), clock=clock,
                     draft=draft, overlap=overlap)
    gc_was = gc.isenabled()
    old_slack = timer_slack(1)
    reason = None
    try:
        gc.collect()
        gc.disable()   # a collection pause would land in someone's latency
        driver.t0 = clock() + int(start_delay_s * 1e9)
        deadline = NEVER if time_limit_s is None else int(time_limit_s * 1e9)
        try:
            reason = driver.run(deadline, stop)
        except KeyboardInterrupt:
            reason = "interrupted"
        stopped_ns = driver.now()
    finally:
        if old_slack is not None:
            timer_slack(old_slack)
        if gc_was:
            gc.enable()
    partial = reason is not None
    keep = n if not partial else int(requests.arrival_ns.searchsorted(stopped_ns, side="right"))
    result = driver.result(keep, int(round(warmup_s * 1e9)))
    extra = _extra(driver, warmup_s)
    extra.update(partial=partial, partial_reason=reason, stopped_at_s=stopped_ns / 1e9 if partial else None,
                 trace_requests=n, **setup,
                 options={"seed": seed, "spin_us": spin_us, "engine_warmup": engine_warmup,
                          "gc_disabled": True, "timer_slack_1ns": old_slack is not None,
                          "block_source": "policy" if driver.paged else "driver", "overlap": driver.overlap})
    if keep_tokens:
        extra["tokens"] = driver.tokens
    return result, extra


def _extra(driver: _Driver, warmup_s: float) -> dict:
    t_warm = int(round(warmup_s * 1e9))
    cols = list(zip(*driver.timing)) if driver.timing else [()] * len(STEP_COLUMNS)
    steps = dict(zip(STEP_COLUMNS, cols))
    for key in ("start_s", "issue_s", "end_s"):
        steps[key] = np.asarray(steps[key], np.float64) / 1e9
    counted = np.asarray(steps["start_s"]) >= t_warm / 1e9
    decode_only = np.asarray(steps["prefill_tokens"], np.int64) == 0 if driver.timing else counted

    def pick(key, mask=None):
        x = np.asarray(steps[key], np.float64)
        m = counted if mask is None else counted & mask
        return _stats(x[m]) if x.size else {"n": 0}

    arrival = driver.arrival_ns
    seen = (driver.delivered_ns >= 0) & (arrival >= t_warm)
    late = np.asarray(driver.lateness, np.float64)
    return {
        "engine_gpu_ms": pick("gpu_ms"),
        "engine_ms": pick("engine_ms"),
        "step_host_ms": pick("host_ms"),
        "step_host_ms_decode_only": pick("host_ms", decode_only),
        "step_host_ms_with_prefill": pick("host_ms", ~decode_only),
        "schedule_us": pick("schedule_us"),
        "delivery_delay_us": _stats((driver.delivered_ns[seen] - arrival[seen]) / 1e3),
        "wakeup_lateness_us": _stats(late / 1e3),
        "graph_steps": int(np.asarray(steps["graph"], bool)[counted].sum()) if driver.timing else 0,
        "swaps": dict(driver.swaps),
        "swapped_rows": sorted(driver.swapped_rows)[:1000],
        "padding_null_writes": driver.padding_null_writes,
        "failed_steps": len(driver.failures), "failures": driver.failures[:100],
        "engine_warnings": list(getattr(driver.engine, "warnings", []))[:20],
        "draft_ms": pick("draft_ms"),
        "draft_steps": driver.proposer.steps if driver.proposer is not None else 0,
        "overlap_ms": pick("overlap_ms"),
        "steps": steps,
    }


def write_live_steps_csv(path, steps: dict) -> None:
    """DIR/live_steps.csv: one row per step (see :data:`STEP_COLUMNS`), written atomically."""
    from schedsim.files import write_columns_csv

    write_columns_csv(path, steps, STEP_COLUMNS)
