"""``paged-kv``: vLLM's scheduler over a paged KV cache.

Follows vLLM v1's ``Scheduler.schedule`` (vllm/v1/core/sched/scheduler.py):

1. a token budget of ``max_num_batched_tokens`` per step;
2. running requests first, in admission order, each getting the rest of its known
   tokens (a prefill chunk, or 1 when decoding) within the budget and
   ``long_prefill_token_threshold``; when its blocks cannot be allocated a victim is
   preempted, repeatedly, possibly itself: the *last* running request (``fcfs``) or the
   lowest-priority one, latest arrival first (``priority``; a victim already scheduled
   this step gives its tokens back);
3. waiting requests only if nothing was preempted, in order (arrival, or (priority,
   arrival)), while the budget lasts and fewer than ``max_num_seqs`` run; one whose blocks
   do not fit stops admission. With ``scheduler_reserve_full_isl`` a request is admitted
   only when blocks for its whole known sequence fit (``full_sequence_must_fit``), though
   only its first chunk's are allocated; without chunked prefill a prompt that does not
   fit the budget whole stops admission;
4. preemption by recompute: blocks freed, progress reset, back to the waiting queue;
5. chunked prefill; prefix caching of full blocks (``enable_prefix_caching``).

``vllm_compat`` picks the vLLM release whose defaults the unset switches take
(:data:`VLLM_COMPAT`; docs/vllm.md names the versions): ``current`` (the default), ``0.10``
or ``0.8``. Besides the switches vLLM has flags for, it sets three behaviours vLLM has no
flag for: the free-block order (newer vLLM puts freed blocks without a hash at the head
of the free queue), where the watermark applies (newer vLLM: only to waiting or
preempted requests while something runs; before: every admission) and requests longer
than the cache (newer vLLM admits one whose prompt and one token fit and stops its
generation at the limit, ``length_capped`` in the stats; before: rejected).

``preemption_mode="swap"`` takes vLLM v0's swap path instead (vllm/core/scheduler.py):
the victim's blocks move to ``swap_space_gb`` of host memory, swapped requests resume
before new admissions, and admissions keep ``watermark`` of the GPU blocks free. v0's
separate prefill and decode steps are not modelled: steps stay v1's mixed ones.

Requests whose prompt plus output exceed ``max_model_len``, or need more blocks than the
GPU has, are rejected with reason ``too_long`` when they arrive (``0.8`` and ``0.10``), or
stopped at that limit (``current``; rejected only when the prompt and one token do not fit).
"""

from __future__ import annotations

import sys
from array import array

import numpy as np

from policies.kv_cache import KVCacheManager
from policies.llm_common import (REJECT_TOO_LONG, BlockKeys, PriorityWaiting, Progress, Waiting, check_token_columns,
                                 make_step, rejects, shareable_blocks)
from schedsim.errors import InputError
from schedsim.core.llm_policy import LLMPolicy, SpeculativeConfig, Step, int_max, kv_budget

VLLM_COMPAT = {
    "0.8": dict(scheduler_reserve_full_isl=False, async_scheduling=False, enable_prefix_caching=False,
                free_unhashed_first=False, watermark_while_running=False, caps_long_requests=False),
    "0.10": dict(scheduler_reserve_full_isl=False, async_scheduling=False, enable_prefix_caching=True,
                 free_unhashed_first=False, watermark_while_running=False, caps_long_requests=False),
    "current": dict(scheduler_reserve_full_isl=True, async_scheduling=True, enable_prefix_caching=True,
                    free_unhashed_first=True, watermark_while_running=True, caps_long_requests=True),
}
"""Each ``--vllm-compat`` preset: the defaults of the switches left unset (docs/vllm.md)."""

SCHEDULING_POLICIES = ("fcfs", "priority")


class PagedKV(LLMPolicy):
    name = "paged-kv"

    def __init__(self, model_spec: str = "llama-1b", block_size: int = 16,
                 num_gpu_blocks: int | None = None, gpu_memory_gb: float | None = None,
                 gpu_memory_utilization: float = 0.9, max_num_seqs: int = 256,
                 max_num_batched_tokens: int | None = None, enable_prefix_caching: bool | None = None,
                 preemption_mode: str = "recompute", swap_space_gb: float = 4.0,
                 watermark: float | None = None, long_prefill_token_threshold: int = 0,
                 max_model_len: int | None = None, vllm_compat: str = "current",
                 scheduler_reserve_full_isl: bool | None = None, async_scheduling: bool | None = None,
                 scheduling_policy: str = "fcfs", enable_chunked_prefill: bool = True,
                 max_num_partial_prefills: int | None = None, speculative_config=None):
        if vllm_compat not in VLLM_COMPAT:
            raise InputError(f"--vllm-compat: {vllm_compat!r} is not valid; expected one of "
                             f"{', '.join(VLLM_COMPAT)}")
        preset = VLLM_COMPAT[vllm_compat]
        if preemption_mode not in ("recompute", "swap"):
            raise InputError(f"--preemption-mode: {preemption_mode!r} is not valid; expected recompute or swap")
        if scheduling_policy not in SCHEDULING_POLICIES:
            raise InputError(f"--scheduling-policy: {scheduling_policy!r} is not valid; expected fcfs or priority")
        for flag, value in (("--max-num-seqs", max_num_seqs),
                            ("--max-num-batched-tokens", max_num_batched_tokens),
                            ("--max-num-partial-prefills", max_num_partial_prefills)):
            if value is not None and int(value) < 1:
                raise InputError(f"{flag}: {value} is not valid; expected an integer >= 1")
        if long_prefill_token_threshold < 0:
            raise InputError(f"--long-prefill-token-threshold: {long_prefill_token_threshold} must be >= 0")
        self.vllm_compat = vllm_compat
        self.speculative = None if speculative_config is None else SpeculativeConfig.parse(speculative_config)
        self.chunked_prefill = bool(enable_chunked_prefill)
        given_tokens = max_num_batched_tokens

        def budget_for(tokens: int):
            return kv_budget(model_spec, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                             gpu_memory_gb=gpu_memory_gb,
                             gpu_memory_utilization=gpu_memory_utilization,
                             max_num_batched_tokens=tokens,
                             max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                             swap_space_gb=swap_space_gb if preemption_mode == "swap" else 0.0)

        self.budget = budget_for(8192 if given_tokens is None else int(given_tokens))
        if given_tokens is None:
            max_num_batched_tokens = 8192
            if not self.chunked_prefill:   # vLLM's default then: a whole prompt of any length fits
                max_num_batched_tokens = max(self.budget.max_model_len, 2048)
                self.budget = budget_for(max_num_batched_tokens)
        elif not self.chunked_prefill and int(given_tokens) < self.budget.max_model_len:
            raise InputError(f"--max-num-batched-tokens: {given_tokens} is smaller than --max-model-len "
                             f"{self.budget.max_model_len}; without chunked prefill a whole prompt must fit "
                             f"one step (as vLLM requires); raise it, lower --max-model-len or enable "
                             f"chunked prefill")
        self.block_size = int(block_size)
        self.max_num_seqs = int(max_num_seqs)
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        self.prefix_caching = bool(preset["enable_prefix_caching"] if enable_prefix_caching is None
                                   else enable_prefix_caching)
        self.reserve_full_isl = bool(preset["scheduler_reserve_full_isl"] if scheduler_reserve_full_isl is None
                                     else scheduler_reserve_full_isl)
        self.async_scheduling = bool(preset["async_scheduling"] if async_scheduling is None
                                     else async_scheduling)
        """Whether the engine prepares a step while the one before runs (the cost model reads it)."""
        self.priority = scheduling_policy == "priority"
        self.scheduling_policy = scheduling_policy
        self.free_unhashed_first = preset["free_unhashed_first"]
        self.watermark_while_running = preset["watermark_while_running"]
        self.caps_long_requests = preset["caps_long_requests"]
        self.max_partial = int(max_num_partial_prefills) if max_num_partial_prefills else 0
        self.swap = preemption_mode == "swap"
        if watermark is None:
            watermark = 0.01 if self.swap else 0.0   # v0's default; v1 keeps none
        if not 0.0 <= watermark < 1.0:
            raise InputError(f"--watermark: {watermark} is not valid; expected 0 <= watermark < 1")
        self.watermark_blocks = int(watermark * self.budget.num_blocks)
        self.threshold = int(long_prefill_token_threshold)
        self.kv_blocks_total = self.budget.num_blocks - 1  # block 0 is vLLM's null block

    # The switches under vLLM's names (what a run's summary records as its effective settings).
    enable_prefix_caching = property(lambda self: self.prefix_caching)
    scheduler_reserve_full_isl = property(lambda self: self.reserve_full_isl)
    enable_chunked_prefill = property(lambda self: self.chunked_prefill)
    long_prefill_token_threshold = property(lambda self: self.threshold)
    max_num_partial_prefills = property(lambda self: self.max_partial or None)

    def settings(self) -> dict:
        """The vLLM switches this policy runs with, defaults resolved."""
        return {name: getattr(self, name) for name in (
            "vllm_compat", "scheduler_reserve_full_isl", "async_scheduling", "scheduling_policy",
            "enable_chunked_prefill", "enable_prefix_caching", "long_prefill_token_threshold",
            "max_num_partial_prefills", "max_num_batched_tokens")}

    def reset(self, requests) -> None:
        super().reset(requests)
        check_token_columns(requests, self.name)
        self.p = p = Progress(requests)
        n = len(requests)
        # Per-request columns in machine integers (array.array), each with a numpy view of the
        # same memory: the per-row paths (admission, preemption, a step of a few rows) read
        # and write Python ints, a busy step all its running rows at once through the views
        # (_running_columns). Prompt and output, written only on arrival, are lists and copies.
        p.computed, p.generated = _column(n), _column(n)
        self.cap = _column(n)   # tokens each request's blocks hold: skips the manager on most decodes
        self.full = _column(n)   # blocks vLLM would have cached by now (_cache_full_blocks)
        # Leading blocks whose keys other requests may share: registered once full.
        self.shared = _column(n, shareable_blocks(requests, self.block_size))
        self._computed, self._generated, self._cap, self._full, self._shared = (
            np.frombuffer(col, dtype=np.int64) for col in (p.computed, p.generated, self.cap, self.full, self.shared))
        self._prompt = np.asarray(p.prompt, dtype=np.int64)
        self._output = np.asarray(p.output, dtype=np.int64)
        self._running_rows = None   # self.running as an array, where on_step_done knows it
        # Whether a running request's count of full blocks (full) must be kept step by step:
        # where some request has keys others may share (registered as its blocks fill) or a
        # swap registers its victim's full blocks. Otherwise nothing reads it while the
        # request runs (a finish counts its full blocks afresh, a recompute preemption its
        # computed tokens), and steps leave it alone.
        self._tracks_full = self.prefix_caching and (self.swap or bool(self._shared.any()))
        self.kv = KVCacheManager(self.budget.num_blocks, self.block_size,
                                 enable_prefix_caching=self.prefix_caching,
                                 num_swap_blocks=self.budget.num_swap_blocks,
                                 free_unhashed_first=self.free_unhashed_first)
        self.running: list[int] = []
        self.waiting = PriorityWaiting(requests) if self.priority else Waiting()
        self.length_capped = 0
        self.prio = requests.priority.astype(np.int64).tolist() if self.priority else None
        self.arrival = requests.arrival_ns.tolist() if self.priority else None
        spec = self.speculative
        self.k = spec.num_speculative_tokens if spec else 0
        self.rng = np.random.default_rng(spec.seed) if spec else None
        self.drafted = self.accepted = 0
        self.swapped = Waiting()
        self.keys: dict[int, BlockKeys] = {}
        self.too_long: list[int] = []
        self.admitted_before = set()
        self.hit_tokens = np.zeros(len(requests), dtype=np.int32)
        self.preemptions = self.swaps_out = self.swap_fallbacks = 0
        self.max_len = self.budget.max_model_len
        self.max_tokens_in_gpu = self.kv_blocks_total * self.block_size

    # --- hooks ---------------------------------------------------------------------------------

    def on_arrivals(self, now_ns: int, first: int, stop: int) -> None:
        prompt, output = self.p.prompt, self.p.output
        for r in range(first, stop):
            total = prompt[r] + output[r]
            if total > self.max_len or total - 1 > self.max_tokens_in_gpu:
                # Newer vLLM: admitted if its prompt and one token fit, stopped at the limit.
                most = min(self.max_len - prompt[r], self.max_tokens_in_gpu + 1 - prompt[r])
                if not self.caps_long_requests or most < 1:
                    self.too_long.append(r)
                    continue
                output[r] = self._output[r] = most
                self.length_capped += 1
            if not self.chunked_prefill and prompt[r] > self.max_num_batched_tokens:
                self.too_long.append(r)   # only when --max-model-len is above the budget
                continue
            self.waiting.append(r)

    def on_arrivals_in_run(self, now_ns: int, first: int, stop: int) -> bool:
        """Queue them as :meth:`on_arrivals` does; the run stands unless one is rejected now
        (its rejection goes out with the next step)."""
        rejected = len(self.too_long)
        self.on_arrivals(now_ns, first, stop)
        return len(self.too_long) == rejected

    def schedule(self, now_ns: int) -> Step:
        step = self._schedule_once()
        # A priority victim may be the only request that could run: vLLM's next iteration
        # schedules at once the rest; here that is the same step, with both preemptions.
        while not len(step) and len(step.preempted):
            first = step
            step = self._schedule_once()
            step.preempted = np.concatenate([first.preempted, step.preempted])
            step.rejects = first.rejects + step.rejects
            self._made = step
        return step

    def _schedule_once(self) -> Step:
        p, kv, bs = self.p, self.kv, self.block_size
        prompt, generated, computed = p.prompt, p.generated, p.computed
        budget = self.max_num_batched_tokens
        cap = self.cap  # tokens each request's blocks hold: skips the manager on most decodes
        threshold = self.threshold
        tracks_full = self._tracks_full   # (else nothing reads full[r] while r runs: see reset)
        k, limit = self.k, min(self.max_len, self.max_tokens_in_gpu)
        rows, ntok, ctx, emit = [], [], [], []
        preempted: list[int] = []
        running = self.running
        partial_limit = self.max_partial
        partial = 0   # rows of this step still computing prompt tokens (--max-num-partial-prefills)
        partial_rows: set[int] = set()
        skipped = False
        i = 0
        head = None
        if len(running) >= self.VECTOR_ROWS and not partial_limit and not k:
            head = self._running_columns(budget)
            if head is not None:   # the loop below then has nothing left to do
                i, budget = head[0].shape[0], head[4]
        self._running_rows = None
        while i < len(running) and budget > 0:
            r = running[i]
            c = computed[r]
            known = prompt[r] + generated[r]
            n = known - c
            if partial_limit and n > 1:
                if partial >= partial_limit:
                    skipped = True
                    i += 1
                    continue
                partial += 1
                partial_rows.add(r)
            if k and n == 1:   # a decode: verify its token and k draft tokens, with KV slots for all
                n = min(1 + k, limit - c)
            if threshold and n > threshold:
                n = threshold
            if n > budget:
                n = budget
            end = c + n
            if end > cap[r]:  # needs a new block (a decode: once in block_size steps)
                while kv.allocate(r, end) is None:
                    if self.priority:
                        victim = self._priority_victim()
                        at = running.index(victim)
                        del running[at]
                        if at < i:   # scheduled earlier this step: it gives its tokens back
                            i -= 1
                            if victim in rows:
                                j = rows.index(victim)
                                budget += ntok[j]
                                if victim in partial_rows:
                                    partial -= 1
                                del rows[j], ntok[j], ctx[j], emit[j]
                    else:
                        victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim == r:
                        break
                else:
                    cap[r] = -(-end // bs) * bs
            if end <= cap[r]:
                if tracks_full and end // bs > c // bs:   # (only verified tokens are cached)
                    self._cache_full_blocks(r, min(end, known) // bs)
                rows.append(r); ntok.append(n); ctx.append(c); emit.append(end >= known)
                budget -= n
                i += 1
                continue
            break
        all_running = i == len(running) and not skipped
        swap_in_blocks = 0
        admitted = False
        if not preempted:
            if self.swapped:
                budget, swap_in_blocks = self._resume_swapped(budget, rows, ntok, ctx, emit)
                admitted = swap_in_blocks > 0
            while self.waiting and budget > 0 and len(running) < self.max_num_seqs and not self.swapped:
                r = self.waiting[0]
                known = prompt[r] + generated[r]
                hits = 0
                if self.prefix_caching:
                    first = r not in self.admitted_before
                    # A first admission with only its own keys (none registered before it runs)
                    # looks up no key: the lookup is counted and finds nothing.
                    keys = self._keys(r) if self.LOOKUP_EVERY_ADMISSION or not first or self.shared[r] else ()
                    hits = kv.computed_prefix(r, keys, known, count=first)
                n = known - hits
                if partial_limit and n > 1:
                    if partial >= partial_limit:
                        break
                    partial += 1
                if self.threshold and n > self.threshold:
                    n = self.threshold
                if n > budget:
                    if not self.chunked_prefill:
                        break   # the whole prompt or nothing: it waits, and so do those behind it
                    n = budget
                # Newer vLLM keeps the watermark only when admitting beside running requests.
                mark = self.watermark_blocks if running or not self.watermark_while_running else 0
                if kv.allocate(r, hits + n, self.keys.get(r) if hits else None, num_cached_tokens=hits,
                               watermark_blocks=mark, full_tokens=known if self.reserve_full_isl else 0) is None:
                    break
                if self.prefix_caching:
                    self.full[r] = hits // bs   # what it holds cached: its hit blocks
                    if (hits + n) // bs > hits // bs:
                        self._cache_full_blocks(r, (hits + n) // bs)
                self.waiting.popleft()
                running.append(r)
                computed[r] = hits
                cap[r] = -(-(hits + n) // bs) * bs
                if r not in self.admitted_before:
                    self.admitted_before.add(r)
                    self.hit_tokens[r] = hits
                rows.append(r); ntok.append(n); ctx.append(hits); emit.append(hits + n == known)
                budget -= n
                admitted = True
        repeat = 1
        spec = {}
        if k:   # each verifying row's accepted draft tokens, drawn now (the engine's outcome)
            spec = self._accept(rows, ntok, ctx, emit)
            all_running = False   # no two steps alike: never repeated
        if head is None:
            step = make_step(rows, ntok, ctx, emit)
        else:   # the running rows' columns, then any admitted ones (each column in one call)
            h_rows, h_ntok, h_ctx, h_emit = head[:4]
            if rows:
                step = Step(rows=np.concatenate((h_rows, rows), dtype=np.int64),
                            num_tokens=np.concatenate((h_ntok, ntok), dtype=np.int32, casting="unsafe"),
                            context=np.concatenate((h_ctx, ctx), dtype=np.int32, casting="unsafe"),
                            emits=np.concatenate((h_emit, emit), dtype=bool))
            else:
                step = Step(rows=h_rows, num_tokens=h_ntok.astype(np.int32), context=h_ctx.astype(np.int32),
                            emits=h_emit)
        # Identical steps follow only when every row decodes: a one-token prefill chunk (a
        # budget squeezed to 1) emits nothing now but will emit once its prompt is in.
        if head is None:
            if rows and all_running and not preempted and not admitted and max(ntok) == 1 and all(emit):
                repeat = self._repeat_horizon(rows, ctx)
                if repeat > 1 and self.reserve_full_isl and tracks_full and self.waiting:
                    repeat = self._until_new_shared_keys(rows, ctx, repeat)
        elif all_running and not admitted and int_max(step.num_tokens) == 1 and step.emits.all():
            repeat = self._repeat_horizon(step.rows, step.context)
            if repeat > 1 and self.reserve_full_isl and tracks_full and self.waiting:
                repeat = self._until_new_shared_keys(step.rows, step.context, repeat)
        step.repeat = repeat
        # A request arriving during the run joins the waiting queue behind a head that this
        # step could not admit and, the same steps being decided all along, will not admit
        # before the run ends; first-come first-served only (a priority could put it first).
        step.arrivals_wait = repeat > 1 and not self.priority and bool(self.waiting)
        step.rejects = rejects(self.too_long)
        step.swap_in_blocks, step.swap_out_blocks = swap_in_blocks, self._swapped_out_now
        step.kv_blocks_used, step.waiting = kv.num_used_blocks, len(self.waiting) + len(self.swapped)
        if preempted:
            step.preempted = np.array(preempted, dtype=np.int64)
        elif (self.DECODE_AFTER and head is None and repeat == 1 and all_running and not k and not self.swap and not self.priority
              and not tracks_full and not self.waiting and rows and len(rows) < self.VECTOR_ROWS
              and len(rows) <= self.max_num_batched_tokens and all(emit)):
            step.then = self._decode_after(rows, ntok, ctx)
        if k:
            step.emit_tokens = np.array([spec.get(r, 1 if e else 0) for r, e in zip(rows, emit)], dtype=np.int32)
            step.draft_tokens = k
            # Only decodes and verifications (each row's tokens past its known ones are drafts).
            step.verify_only = bool(rows) and all(
                c + 1 >= p.prompt[r] + p.generated[r] for r, c in zip(rows, ctx))
        self._spec = spec
        self._made = step
        self._all_running = head is not None and all_running   # step.rows is then self.running
        self.too_long = []
        self._swapped_out_now = 0
        return step

    def on_step_done(self, now_ns: int, step: Step, repeats: int) -> None:
        then = step.then
        if then is not None and repeats > 1:   # the step, then repeats - 1 of its decode step
            self.on_step_done(now_ns, step, 1)
            self._take_first_blocks(then)
            self.on_step_done(now_ns, then, repeats - 1)
            return
        p, kv, bs, cap = self.p, self.kv, self.block_size, self.cap
        computed, generated, output = p.computed, p.generated, p.output
        many = step.rows.shape[0] >= self.VECTOR_ROWS and not self.k
        if many:
            self._advance_columns(step, repeats)
            finished = self._finished
        else:
            rows, ntok, ctx, emit = (step.rows.tolist(), step.num_tokens.tolist(),
                                     step.context.tolist(), step.emits.tolist())
            if repeats > 1:
                self._replay_allocations(rows, ctx, repeats)
                for r in rows:
                    c = computed[r] = computed[r] + repeats
                    generated[r] += repeats
                    if c > cap[r]:
                        cap[r] = -(-c // bs) * bs
            elif self.k:
                spec = self._spec if step is self._made else {
                    r: int(t) for r, n, c, t in zip(rows, ntok, ctx, step.emit_tokens.tolist())
                    if c + n > p.prompt[r] + generated[r]}
                for r, n, e in zip(rows, ntok, emit):
                    t = spec.get(r)
                    if t is None:
                        computed[r] += n
                        if e:
                            generated[r] += 1
                    else:   # a verified row: its accepted tokens and the one sampled after them
                        computed[r] += t
                        generated[r] += t
            else:
                for r, n, e in zip(rows, ntok, emit):
                    computed[r] += n
                    if e:
                        generated[r] += 1
            finished = [r for r in rows if generated[r] >= output[r]]
            if self._tracks_full and repeats > 1:
                # What the steps of the run registered one by one: a row's blocks up to the last
                # block it filled, where it filled one (a row behind, such as one swapped in with
                # fresh blocks, registers at its next filled block, as step by step).
                full = self.full
                for r in rows:
                    c = computed[r]
                    if c // bs > full[r] and c // bs > (c - repeats) // bs and generated[r] < output[r]:
                        self._cache_full_blocks(r, c // bs)
        if finished:
            done = set(finished)
            for r in finished:
                if self.prefix_caching:
                    self._cache_full_blocks(r, computed[r] // bs)
                kv.free(r, self.full[r])
                cap[r] = 0
                self.keys.pop(r, None)
            if len(finished) < 8:   # a handful: removing them is cheaper than a new list
                for r in finished:
                    self.running.remove(r)
            else:
                self.running = [r for r in self.running if r not in done]

    def _advance_columns(self, step: Step, repeats: int) -> None:
        """:meth:`on_step_done` of a step of many rows, before its finished rows leave, on
        the column views: progress, blocks of a repeated run, registrations; sets
        ``_finished`` and, where the step's rows were all the running ones in order (its own
        step, every running row in it), ``_running_rows`` for the next step."""
        bs, rows = self.block_size, step.rows
        computed, generated, cap = self._computed, self._generated, self._cap
        if repeats > 1:
            self._replay_allocations_many(rows, step.context, repeats)
            computed[rows] += repeats
            generated[rows] += repeats
            c = computed[rows]
            grew = c > cap[rows]
            cap[rows[grew]] = -(-c[grew] // bs) * bs
        else:   # rows are distinct within a step
            computed[rows] += step.num_tokens
            generated[rows] += step.emits
        left = generated[rows] < self._output[rows]
        if self._tracks_full and repeats > 1:   # as the row-by-row path, on arrays
            c = computed[rows]
            filled = c // bs
            due = (filled > self._full[rows]) & (filled > (c - repeats) // bs) & left
            for r, f in zip(rows[due].tolist(), filled[due].tolist()):
                self._cache_full_blocks(r, f)
        if _all(left):
            self._finished = []
            running = rows
        else:
            self._finished = rows[~left].tolist()
            running = rows[left]
        if step is self._made and self._all_running:
            self._running_rows = running

    def stats(self) -> dict:
        return {"preemptions": self.preemptions, "swaps_out": self.swaps_out,
                "length_capped": self.length_capped,
                **({"spec_draft_tokens": self.drafted, "spec_accepted_tokens": self.accepted,
                    "spec_acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0}
                   if self.k else {}),
                "output_tokens_per_request": np.asarray(self.p.output, dtype=np.int64),
                "swap_fallbacks_to_recompute": self.swap_fallbacks,
                "prefix_hit_tokens_per_request": self.hit_tokens,
                "kv_blocks_total": self.kv_blocks_total, "block_size": self.block_size,
                "num_gpu_blocks": self.budget.num_blocks, "kv_budget": self.budget.describe()}

    # --- helpers --------------------------------------------------------------------------------

    _swapped_out_now = 0
    _made = None   # the last step schedule() made
    _all_running = False
    _finished: list = []
    VECTOR_ROWS = 24
    """From this many running rows a step's running part is worked out on arrays
    (:meth:`_running_columns`); below it, row by row (cheaper for a handful of rows)."""
    DECODE_AFTER = True
    """Whether a step of fewer rows whose rows all emit carries the repeatable decode step
    that would follow it (:attr:`Step.then`: a simulator then runs both as one event)."""
    LOOKUP_EVERY_ADMISSION = False
    """Whether every admission looks its prompt's keys up in the prefix cache, as vLLM does. Off,
    the first admission of a request whose keys are all its own (no block another request could
    share) looks up none: none of them is cached before it runs, so the lookup would find nothing."""

    COMPILED = True
    """Whether :func:`~schedsim.core.llm_simulate.simulate_llm` replays this policy compiled where
    it can (:mod:`policies.paged_kv_compiled`: the same results, bit for bit); False runs it here."""
    COMPILED_FROM = 5000
    """Requests from which a run is replayed compiled while the replay is not loaded yet in
    this process: loading it (numba and its cached machine code) takes 0.5-0.8 s, what this
    path spends on some 5,000 requests."""

    def replay_compiled(self, requests, cost) -> dict | None:
        """The whole run replayed compiled, just after :meth:`reset`: the driver's log, or None
        where the replay does not cover these settings (nothing changed then)."""
        if not self.COMPILED or type(self) is not PagedKV:   # (a subclass may decide otherwise)
            return None
        module = sys.modules.get("policies.paged_kv_compiled")
        if len(requests) < self.COMPILED_FROM and not (module is not None and module.loaded()):
            return None
        from policies import paged_kv_compiled   # (lazy: numba takes 0.3 s to import)

        replayed = paged_kv_compiled.replay(self, requests, cost)
        if replayed is not None:
            paged_kv_compiled.apply(self, cost, replayed)
            replayed["reject_reason"] = REJECT_TOO_LONG
        return replayed

    def _cache_full_blocks(self, r: int, num_full: int) -> None:
        """Cache ``r``'s first ``num_full`` blocks, as vLLM does once they are full.

        Only the leading blocks whose keys other requests may share are registered now
        (:func:`~policies.llm_common.shareable_blocks`: a hash id another prompt has at the
        same place). A block keyed by its own request (every block of an Azure prompt,
        every generated block, a Mooncake block whose hash id no other request has there)
        can only be found again by that request, after it gives its blocks back on a
        preemption: :meth:`_preempt` registers those then (``full[r]`` says how many),
        and a request that finishes never does. Hits, evictions and block ids stay what
        registering every block at once gives (tests/unit/policies/test_lazy_prefix.py), and a run
        saves a dict insertion and a later eviction per block (~1.7M on Azure conv).
        """
        if num_full > self.full[r]:
            self.full[r] = num_full
            shared = int(self.shared[r])
            if shared:
                self.kv.cache_blocks(r, min(num_full, shared), self._keys(r))

    def _keys(self, r: int) -> BlockKeys:
        """``r``'s prefix-cache keys, worked out when first asked for: a request whose keys
        are all its own needs them only once it is preempted."""
        keys = self.keys.get(r)
        if keys is None:
            keys = self.keys[r] = BlockKeys(self.requests, r, self.block_size)
        return keys

    def _preempt(self, victim: int) -> None:
        self.preemptions += 1
        if self.swap:
            if self.kv.can_swap_out(victim):
                if self.prefix_caching:   # the blocks put off by _cache_full_blocks, as their keys stay
                    self.kv.cache_blocks(victim, self.full[victim], self._keys(victim))
                self._swapped_out_now += self.kv.swap_out(victim)
                self.cap[victim] = 0
                self.swaps_out += 1
                self.swapped.append(victim)
                return
            self.swap_fallbacks += 1  # v0 aborts here; we recompute instead and count it
        full = self.p.computed[victim] // self.block_size
        if self.prefix_caching:
            self.kv.cache_blocks(victim, full, self._keys(victim))
        self.kv.free(victim, full)
        self.cap[victim] = 0
        self.p.computed[victim] = 0
        self.waiting.appendleft(victim)

    _spec: dict = {}

    def _accept(self, rows: list, ntok: list, ctx: list, emit: list) -> dict:
        """Tokens each verifying row emits: 1 + its accepted draft tokens, at most what it has
        left. A row's i-th draft is accepted when one uniform draw falls below the i-th
        per-position rate (non-increasing, so the accepted ones are a prefix)."""
        p, acceptance, out = self.p, self.speculative.acceptance, {}
        for r, n, c in zip(rows, ntok, ctx):
            known = p.prompt[r] + p.generated[r]
            drafts = c + n - known
            if drafts <= 0:
                continue
            u = self.rng.random()
            m = 0
            while m < drafts and u < acceptance[m]:
                m += 1
            self.drafted += drafts
            self.accepted += m
            out[r] = min(1 + m, p.output[r] - p.generated[r])
        return out

    def _priority_victim(self) -> int:
        """The running request vLLM's priority scheduler preempts: the largest (priority, arrival)."""
        prio, arrival = self.prio, self.arrival
        return max(self.running, key=lambda r: (prio[r], arrival[r], r))

    def _resume_swapped(self, budget, rows, ntok, ctx, emit):
        """Swap requests back in, oldest first, before any new admission (vLLM v0)."""
        p, kv = self.p, self.kv
        moved = 0
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            r = self.swapped[0]
            c = p.computed[r]
            known = p.prompt[r] + p.generated[r]
            n = min(known - c, budget)
            bs = self.block_size
            grow = -(-(c + n) // bs) - -(-c // bs)  # blocks this step adds once it is back
            if not kv.can_swap_in(r, watermark_blocks=self.watermark_blocks + grow):
                break
            moved += kv.swap_in(r)
            self.full[r] = 0   # fresh blocks, none cached
            if kv.allocate(r, c + n) is None:  # can_swap_in left room for this step's tokens
                raise AssertionError(f"row {r}: swapped in but no block for its next token")
            self.cap[r] = len(kv.blocks_of(r)) * self.block_size
            self.swapped.popleft()
            self.running.append(r)
            rows.append(r); ntok.append(n); ctx.append(c); emit.append(c + n == known)
            budget -= n
        return budget, moved

    def _running_columns(self, budget: int):
        """The running rows' part of a step, worked out on arrays: ``(rows, num_tokens,
        context, emits, budget left)`` as the row-by-row loop of :meth:`_schedule_once`
        gives them, its block allocations and cache registrations made; None, changing
        nothing, when their new blocks do not all fit (the loop then preempts).

        Each row asks for the rest of its known tokens (capped by the threshold), in
        order while the budget lasts; only rows that cross a block boundary touch the block
        manager, and only rows filling a block whose key other requests may share register it."""
        bs, cap, full = self.block_size, self._cap, self._full
        rows = self._running_rows
        if rows is None:
            rows = np.array(self.running, dtype=np.int64)
        c = self._computed[rows]
        known = self._prompt[rows] + self._generated[rows]
        n = known - c
        if self.threshold:
            np.minimum(n, self.threshold, out=n)
        cs = _cumsum(n)
        if cs[-1] <= budget:
            budget -= int(cs[-1])
        else:   # rows start while budget is left; the last one gets what is left
            before = cs - n
            m = int(before.searchsorted(budget))
            rows, c, known, n = rows[:m], c[:m], known[:m], n[:m]
            n[m - 1] = budget - before[m - 1]
            budget = 0
        end = c + n
        grow = (end > cap[rows]).nonzero()[0]
        register = due = None
        if self._tracks_full:
            filled = np.minimum(end, known) // bs
            due = (end // bs > c // bs) & (filled > full[rows])
            if _any(due):
                shares = due & (self._shared[rows] > full[rows])
                if _any(shares):   # registrations interleave with allocations, row by row
                    register = shares
            else:
                due = None
        if register is not None:
            if not self._allocate_in_order(rows, end, grow, register.nonzero()[0], filled):
                return None
            due &= ~register   # _cache_full_blocks moved their count
        if grow.shape[0]:
            g_rows, g_end = rows[grow], end[grow]
            if register is None and not self.kv.allocate_each(g_rows.tolist(), g_end.tolist()):
                return None
            cap[g_rows] = -(-g_end // bs) * bs
        if due is not None:
            full[rows[due]] = filled[due]
        return rows, n, c, end >= known, budget

    def _allocate_in_order(self, rows, end, grow, register, filled) -> bool:
        """:meth:`_running_columns`'s allocations and registrations in row order, where some
        rows register shared keys: each registration after the allocations of the rows up
        to it (its own included), those between two registrations in one call; False,
        changing nothing, if the allocations do not all fit."""
        kv = self.kv
        g_rows, g_end = rows[grow].tolist(), end[grow].tolist()
        if not kv.fits_each(g_rows, g_end):
            return False
        row_list, done = rows.tolist(), 0
        for i, upto, f in zip(register.tolist(), grow.searchsorted(register, "right").tolist(),
                              filled[register].tolist()):
            if upto > done:
                kv.allocate_each(g_rows[done:upto], g_end[done:upto])
                done = upto
            self._cache_full_blocks(row_list[i], f)
        if done < len(g_rows):
            kv.allocate_each(g_rows[done:], g_end[done:])
        return True

    def _repeat_horizon(self, rows, ctx, most: int | None = None, free: int | None = None) -> int:
        """How many identical decode steps can run before a request finishes or blocks run out
        (``rows`` and ``ctx`` as lists, or arrays for a step of many rows); ``most``: the
        fewest tokens a row has left, ``free``: free blocks once the first step has its
        own (None: as they are now)."""
        if most is None and isinstance(rows, np.ndarray):
            most = int(_minimum(self._output[rows] - self._generated[rows]))
        elif most is None:
            output, generated = self.p.output, self.p.generated
            most = min([output[r] - generated[r] for r in rows])
        if most <= 1:
            return 1
        bs = self.block_size
        if free is None:
            free = self.kv.num_free_blocks
        if len(rows) * ((most - 1) // bs + 1) <= free:   # room even if every step took a block
            return most
        c = np.asarray(ctx, dtype=np.int64)
        held = -(-(c + 1) // bs)

        def extra(k: int) -> int:  # blocks steps 2..k allocate on top of the first step's
            return int((-(-(c + k) // bs) - held).sum())

        if extra(most) <= free:
            return most
        lo, hi = 1, most  # extra(lo) <= free < extra(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if extra(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _decode_after(self, rows: list, ntok: list, ctx: list) -> Step | None:
        """The repeatable decode step :meth:`schedule` would make right after this one (every
        row of which emits) if nothing arrived meanwhile: :attr:`Step.then`. None where a
        row finishes with this step or that step would not repeat. Its first step's blocks
        are taken when it runs (:meth:`_take_first_blocks`), as that step would take them."""
        output, generated, cap = self.p.output, self.p.generated, self.cap
        most = min([output[r] - generated[r] for r in rows]) - 1   # left after this step's token
        if most < 2:
            return None
        after = [c + n for c, n in zip(ctx, ntok)]
        need = len([r for r, c in zip(rows, after) if c + 1 > cap[r]])
        free = self.kv.num_free_blocks - need
        if free < 0:
            return None
        repeat = self._repeat_horizon(rows, after, most, free)
        if repeat < 2:
            return None
        then = make_step(rows, [1] * len(rows), after, [True] * len(rows))
        then.repeat = repeat
        then.kv_blocks_used = self.kv.num_used_blocks + need
        return then

    def _take_first_blocks(self, then: Step) -> None:
        """The blocks the first step of ``then`` takes, row by row in its order, as
        :meth:`_schedule_once` would have taken them deciding it."""
        kv, cap, bs = self.kv, self.cap, self.block_size
        for r, c in zip(then.rows.tolist(), then.context.tolist()):
            if c + 1 > cap[r]:
                if kv.allocate(r, c + 1) is None:
                    raise AssertionError(f"row {r}: no block for the decode step after its admission")
                cap[r] = -(-(c + 1) // bs) * bs

    def _until_new_shared_keys(self, rows, ctx, horizon: int) -> int:
        """Cut a decode run before the step in which a row fills a block whose key other
        requests share: registering it there may give the waiting head enough prefix hits
        for its whole prompt to fit (whole-prompt admission counts hits), so that step must
        be decided anew. Without whole-prompt admission hits never change whether a first
        chunk fits (a hit saves as many blocks as it covers)."""
        bs = self.block_size
        if isinstance(rows, np.ndarray):
            sharing = self._shared[rows] > self._full[rows]
            if sharing.any():
                j = (-ctx[sharing].astype(np.int64)) % bs   # step (1-based) whose token fills a block
                j[j == 0] = bs
                j[j == 1] += bs
                horizon = min(horizon, int(j.min()) - 1)
            return max(horizon, 1)
        shared, full = self.shared, self.full
        for r, c in zip(rows, ctx):
            if shared[r] > full[r]:
                j = (-c) % bs or bs   # step (1-based) whose token fills a block
                if j == 1:
                    j += bs
                horizon = min(horizon, j - 1)
        return max(horizon, 1)

    def _replay_allocations(self, rows: list, ctx: list, repeats: int) -> None:
        """Allocate, in vLLM's order, the blocks steps 2..repeats of a repeated decode took.

        Row i's token in step j (0-based) opens a block when ``ctx[i] + j`` is a multiple of
        ``block_size``: at ``j = f, f + bs, ...`` with ``f = (-ctx[i]) % bs or bs``. Step by
        step, vLLM takes them one at a time, rows in step order. That is a round robin over
        the rows sorted by ``f`` (stably): one full round per ``bs`` steps, then a last
        round of the rows whose ``f`` falls within the steps left.
        """
        bs = self.block_size
        rounds, rest = divmod(repeats - 1, bs)
        first = [(-c) % bs or bs for c in ctx]
        total = rounds * len(rows) + len([f for f in first if f <= rest])
        if total:
            cycle = [rows[i] for i in sorted(range(len(rows)), key=first.__getitem__)]
            self.kv.allocate_round_robin(cycle, total)

    def _replay_allocations_many(self, rows: np.ndarray, ctx: np.ndarray, repeats: int) -> None:
        """:meth:`_replay_allocations` of many rows, on arrays."""
        bs = self.block_size
        rounds, rest = divmod(repeats - 1, bs)
        first = (-ctx.astype(np.int64)) % bs
        first[first == 0] = bs
        total = rounds * rows.shape[0] + int(np.count_nonzero(first <= rest))
        if total:
            order = np.argsort(first, kind="stable")
            if total < order.shape[0]:   # less than a round (a short run): the rows that get one
                order = order[:total]
            self.kv.allocate_round_robin(rows[order].tolist(), total)


# ndarray.any/all and np.cumsum without their Python-level wrappers (a busy step makes dozens
# of such calls on a few hundred rows, where the wrappers cost as much as the work).
_any, _all, _cumsum, _minimum = np.logical_or.reduce, np.logical_and.reduce, np.add.accumulate, np.minimum.reduce


def _column(n: int, values: np.ndarray | None = None) -> array:
    """A per-request int64 column: zeros, or ``values``."""
    return array("q", bytes(8 * n) if values is None else np.asarray(values, np.int64).tobytes())
