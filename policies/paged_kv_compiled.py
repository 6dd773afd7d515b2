"""``paged-kv`` replayed in compiled code: the same steps, records and prices, 10-100x faster.

A busy engine decides a step for nearly every arrival and finish, and each decision walks
its running rows: in Python that costs 50-100 us an event, whatever is vectorised. This
module replays :class:`~policies.paged_kv.PagedKV` (row by row, as its reference loop
does), :func:`~schedsim.core.llm_simulate.simulate_llm`'s driver (folded decode runs, cut at
arrivals by division, runs past arrivals that only wait, the decode run a step carries)
and :class:`~schedsim.cost.step_model.StepCostModel`'s prices, compiled with numba, and
hands the driver the step log it would have written. The result is the same bit for bit:
``tests/unit/policies/test_paged_kv_compiled.py`` checks it against the Python path on
random traces and settings.

It covers what the block counts alone decide: where no block is ever found by its key,
the block manager reduces to counts of blocks held. That is every run without prefix
caching, and every run with it whose requests have only their own keys (no shared prefix)
until a request is preempted (its blocks then become findable). First-come first-served,
recompute preemption, no speculative decoding, no ``max_num_partial_prefills``. Anything
else, and a run that reaches a preemption with prefix caching, runs in Python
(:func:`replay` answers None). Without numba, everything does.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from schedsim.core.policy import NEVER

try:
    import numba
except ImportError:   # pragma: no cover - numba is a dependency; a stripped install runs in Python
    numba = None

# --- parameters and state (int64 arrays indexed by these names) -----------------------------------

(P_BS, P_BUDGET, P_MAX_SEQS, P_THRESHOLD, P_CHUNKED, P_PREFIX, P_FULL_ISL, P_WATERMARK, P_MARK_RUNNING,
 P_CAPS, P_MAX_LEN, P_MAX_TOKENS_GPU, P_USABLE, P_DECODE_AFTER, P_VECTOR_ROWS, P_ASYNC, P_GRAPHS,
 P_REAL_KV, P_SERIAL, P_KV_HEADS, P_SPLIT_CTAS, P_MIN_SPLIT, P_WAVE, P_MAX_MEASURED, P_MIN_GRAPH_BLOCKS,
 P_FIRST_CALL, P_LEN) = range(27)
"""Integer parameters of the policy and the cost model."""

(F_OVERHEAD, F_LOOP_A, F_LOOP_B, F_FIRST_CALL, F_LEN) = range(5)
"""Float parameters of the cost model (ns)."""

(S_FREE, S_NRUN, S_WHEAD, S_WTAIL, S_CAPPED, S_PREEMPTIONS, S_NTOOLONG, S_DELIVERED, S_NEXT, S_BEYOND,
 S_NLOG, S_NCOL, S_NRUNS, S_NREJ, S_LEN) = range(15)
"""Scalar state: free blocks, running and waiting counts, counters, log lengths."""

OK, BAIL_PREFIX, BAIL_KV = 0, 1, 2
"""How a replay ends: done; a preemption with prefix caching (blocks become findable by key);
a request that needs more blocks than exist (the Python path raises KVCacheError)."""

KNEE = 1024   # schedsim.cost.step_fit.EAGER_KNEE_TOKENS, checked in _cost_params
LOG_FIELDS = 8


def replay(policy, requests, cost) -> dict | None:
    """Run ``policy`` (reset for ``requests``) over ``requests`` priced by ``cost``, compiled;
    the driver's log and what the policy and cost model hold at the end, or None where the
    run is not covered (module docstring): nothing has changed then."""
    if numba is None or not covered(policy, cost):
        return None
    params, fparams, coef, graph_sizes, warm = _params(policy, cost)
    if sys.stderr.isatty() and _compiles_first():
        print("schedsim: compiling paged-kv's replay for this machine (once; about half a minute)", file=sys.stderr)
    out = _KERNEL(params, fparams, coef, graph_sizes, warm,
                  np.ascontiguousarray(requests.arrival_ns, np.int64),
                  np.asarray(policy.p.prompt, np.int64), np.asarray(policy.p.output, np.int64))
    code, state, log, rows, ntok, emits, run_prices, run_counts, preemptions, rej_rows, rej_ns, output, seen = out
    if code != OK:
        return None
    log = np.ascontiguousarray(log[:state[S_NLOG]].T)   # one row per field
    columns = rows[:state[S_NCOL]], ntok[:state[S_NCOL]], emits[:state[S_NCOL]]
    n = len(requests)

    def log_summary(measured: np.ndarray) -> tuple:
        """:func:`summarize_log` of this replay, for requests ``measured`` (bool per request)."""
        return summarize_log(n, *columns, log[4], log[0], log[2], log[1], log[3], measured)

    return {"state": state, "log": log, "log_summary": log_summary,
            "run_prices": run_prices[:state[S_NRUNS]], "run_counts": run_counts[:state[S_NRUNS]],
            "preemptions": preemptions, "rejected_rows": rej_rows[:state[S_NREJ]],
            "rejected_ns": rej_ns[:state[S_NREJ]], "output": output, "seen_tokens": seen,
            "beyond": int(state[S_BEYOND])}


def loaded() -> bool:
    """Whether the kernel is loaded in this process (a replay then costs no start-up)."""
    return numba is not None and bool(kernel.signatures)


def _compiles_first() -> bool:
    """Whether the next call compiles the kernel: not loaded here, and no cache of it on disk."""
    if kernel.signatures:
        return False
    try:   # (numba's cache index: a private attribute; where it moved, say nothing)
        return not os.path.exists(kernel._cache._cache_file._index_path)
    except AttributeError:
        return False


def covered(policy, cost) -> bool:
    """Whether :func:`replay` covers ``policy``, a PagedKV itself (not a subclass, which may
    change what it decides: :meth:`PagedKV.replay_compiled` checks), reset, priced by ``cost``."""
    from schedsim.cost.step_model import StepCostModel

    if type(cost) is not StepCostModel:
        return False
    if (policy.swap or policy.priority or policy.k or policy.max_partial or not policy.DECODE_AFTER
            or policy.waiting or policy.running):
        return False
    if policy.prefix_caching and policy._shared.any():
        return False   # keys other requests share: blocks are found by key
    if cost._eager_coef is None or cost._gpu_bound or cost.draft is not None:
        return False
    if len(policy.requests) >= 1 << 31 or policy.max_num_batched_tokens >= 1 << 31:
        return False   # (the step log keeps rows and token counts in 32 bits)
    return cost.block_size == policy.block_size   # (prices here use the policy's block size)


def _cost_params(cost) -> tuple:
    from schedsim.cost.llm_shapes import MIN_GRAPH_CONTEXT_BLOCKS
    from schedsim.cost.step_fit import EAGER_KNEE_TOKENS

    if EAGER_KNEE_TOKENS != KNEE:
        raise AssertionError("paged_kv_compiled.KNEE differs from step_fit.EAGER_KNEE_TOKENS")
    att = cost._attention
    return att, MIN_GRAPH_CONTEXT_BLOCKS


def _params(policy, cost) -> tuple:
    att, min_graph_blocks = _cost_params(cost)
    p = np.zeros(P_LEN, np.int64)
    p[P_BS] = policy.block_size
    p[P_BUDGET] = policy.max_num_batched_tokens
    p[P_MAX_SEQS] = policy.max_num_seqs
    p[P_THRESHOLD] = policy.threshold
    p[P_CHUNKED] = policy.chunked_prefill
    p[P_PREFIX] = policy.prefix_caching
    p[P_FULL_ISL] = policy.reserve_full_isl
    p[P_WATERMARK] = policy.watermark_blocks
    p[P_MARK_RUNNING] = policy.watermark_while_running
    p[P_CAPS] = policy.caps_long_requests
    p[P_MAX_LEN] = policy.max_len
    p[P_MAX_TOKENS_GPU] = policy.max_tokens_in_gpu
    p[P_USABLE] = policy.kv.usable_blocks
    p[P_DECODE_AFTER] = policy.DECODE_AFTER
    p[P_VECTOR_ROWS] = policy.VECTOR_ROWS
    p[P_ASYNC] = policy.async_scheduling
    p[P_GRAPHS] = len(cost.graph_sizes or ())
    p[P_REAL_KV] = cost._real_kv
    p[P_SERIAL] = att is not None
    if att is not None:
        p[P_KV_HEADS], p[P_SPLIT_CTAS], p[P_MIN_SPLIT] = att.kv_heads, att.split_ctas, att.min_split_blocks
        p[P_WAVE] = att.multiprocessors * att.blocks_per_multiprocessor
    p[P_MAX_MEASURED] = cost.max_context_measured
    p[P_MIN_GRAPH_BLOCKS] = min_graph_blocks
    p[P_FIRST_CALL] = bool(cost.first_call_ns)
    f = np.zeros(F_LEN, np.float64)
    f[F_OVERHEAD] = cost.overhead_ns
    f[F_LOOP_A], f[F_LOOP_B] = cost.loop_ns
    f[F_FIRST_CALL] = cost.first_call_ns
    coef = np.array(cost._coef, np.float64)
    graph_sizes = np.array(cost.graph_sizes or (0,), np.int64)
    warm = np.array(sorted(t for t in cost.seen_tokens if 0 <= t <= policy.max_num_batched_tokens), np.int64)
    return p, f, coef, graph_sizes, warm


def apply(policy, cost, result: dict) -> None:
    """Leave ``policy`` and ``cost`` as the Python path would for what :meth:`stats` and a
    later run read: counters, capped outputs, token counts priced, the extrapolation warning."""
    state = result["state"]
    policy.preemptions = int(state[S_PREEMPTIONS])
    policy.length_capped = int(state[S_CAPPED])
    output = result["output"]
    policy.p.output = output.tolist()
    policy._output = output
    if cost.first_call_ns:
        cost.seen_tokens |= set(np.flatnonzero(result["seen_tokens"]).tolist())
    if result["beyond"] >= 0:
        cost._beyond(result["beyond"])


# --- the compiled replay ----------------------------------------------------------------------------

_njit = numba.njit(cache=True, nogil=True) if numba is not None else (lambda f: f)



@_njit
def bit_length(x):
    b = 0
    while x > 0:
        x >>= 1
        b += 1
    return b

@_njit
def ceil_div(a, b):
    return -(-a // b)

@_njit
def graph_batch(n, sizes, ngraphs):
    for i in range(ngraphs):
        if sizes[i] >= n:
            return sizes[i]
    return 0

@_njit
def decode_width(p, sizes, n, top):
    bs = p[P_BS]
    if p[P_GRAPHS] and graph_batch(n, sizes, p[P_GRAPHS]):
        blocks = max(ceil_div(top, bs), 1)
        return max(p[P_MIN_GRAPH_BLOCKS], 1 << bit_length(blocks - 1)) * bs
    return ceil_div(top, bs) * bs

@_njit
def serial_keys(p, decodes, width):
    if not decodes:
        return 0
    width_blocks = width // p[P_BS]
    s, pairs = 1, decodes * p[P_KV_HEADS]
    if not pairs > p[P_SPLIT_CTAS] // 8:
        while (pairs * s * 2 <= p[P_SPLIT_CTAS] and width_blocks % (2 * s) == 0
               and width_blocks // (2 * s) >= p[P_MIN_SPLIT]):
            s *= 2
    return ceil_div(decodes * p[P_KV_HEADS] * s, p[P_WAVE]) * (width // s)

@_njit
def kv_quantum(mean, bs):
    return max((1 << bit_length(mean - 1)) // 8, bs)

@_njit
def real_kv_tokens(decodes, kv, bs):
    if not decodes:
        return 0
    mean = ceil_div(kv, decodes)
    q = kv_quantum(mean, bs)
    return decodes * (ceil_div(mean, q) * q)

@_njit
def loop_ns(f, rows):
    return f[F_LOOP_A] + f[F_LOOP_B] * rows

@_njit
def decode_ms_padded(p, coef, sizes, n, width):
    # combine(coef, step_features(...)) term by term, in its order (the same float sum).
    padded = graph_batch(n, sizes, p[P_GRAPHS]) if p[P_GRAPHS] else 0
    t = 0.0
    if padded:
        t = t + coef[0] * 1
        t = t + coef[1] * padded
        gathered = padded * width
        bounds = ((1, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 1 << 30))
        i = 2
        for lo, hi in bounds:
            t = t + coef[i] * (gathered * ((padded >= lo) * (padded <= hi)))
            i += 1
        for j in range(9):   # the eager features, all zero
            t = t + coef[i + j] * 0
        return t
    for i in range(10):   # the graph features, all zero
        t = t + coef[i] * 0
    t = t + coef[10] * 1
    t = t + coef[11] * n
    t = t + coef[12] * 0
    t = t + coef[13] * 0
    t = t + coef[14] * 0
    t = t + coef[15] * n
    t = t + coef[16] * (n * width)
    t = t + coef[17] * (1 if n > 0 else 0)
    t = t + coef[18] * ((n - KNEE) if n > KNEE else 0)
    if p[P_SERIAL]:
        t = t + coef[19] * serial_keys(p, n, width)
    return t

@_njit
def decode_x(p, f, coef, sizes, n, width, real):
    t = decode_ms_padded(p, coef, sizes, n, width)
    if p[P_REAL_KV]:
        t = t + coef[coef.shape[0] - 1] * real
    return t * 1e6 + f[F_OVERHEAD] + loop_ns(f, n)

@_njit
def beyond(S, p, top):
    if top > p[P_MAX_MEASURED] and S[S_BEYOND] < 0:
        S[S_BEYOND] = top

@_njit
def step_ns(p, f, coef, sizes, S, seen, ntok, ctx, nrows):
    bs = p[P_BS]
    tokens = nd = dmax = top = attention = pctx = kv = 0
    for j in range(nrows):
        q, c = ntok[j], ctx[j]
        tokens += q
        if q == 1:
            nd += 1
            kv += c
            if c >= dmax:
                dmax = c + 1
        else:
            attention += q * c + q * (q + 1) // 2
            pctx += c
            if q + c > top:
                top = q + c
    kv += nd
    real = real_kv_tokens(nd, kv, bs) if p[P_REAL_KV] else 0
    if nd == nrows:
        beyond(S, p, dmax)
        x = decode_x(p, f, coef, sizes, nrows, decode_width(p, sizes, nrows, dmax), real)
    else:
        dwidth = ceil_div(dmax, bs) * bs if nd else 0
        top = max(top, dmax)
        beyond(S, p, top)
        # combine(eager_coef, eager_features(1, ...)): the coefficients past the graph ones.
        t = 0.0
        t = t + coef[10] * 1
        t = t + coef[11] * tokens
        t = t + coef[12] * (nrows - nd)
        t = t + coef[13] * attention
        t = t + coef[14] * pctx
        t = t + coef[15] * nd
        t = t + coef[16] * (nd * dwidth)
        t = t + coef[17] * (1 if nd > 0 else 0)
        t = t + coef[18] * ((tokens - KNEE) if tokens > KNEE else 0)
        k = 19
        if p[P_SERIAL]:
            t = t + coef[k] * serial_keys(p, nd, dwidth)
            k += 1
        if p[P_REAL_KV]:
            t = t + coef[k] * real
        x = t * 1e6 + f[F_OVERHEAD] + loop_ns(f, nrows)
        if p[P_FIRST_CALL] and not seen[tokens]:
            x += f[F_FIRST_CALL]
            seen[tokens] = True
    return np.int64(round(x))

@_njit
def host_ns(f, rows):
    return np.int64(round(f[F_OVERHEAD] + loop_ns(f, rows)))

@_njit
def run_segments(p, f, coef, sizes, S, ctx, nrows, k, counts, prices):
    """decode_run_segments into counts/prices; returns how many segments."""
    bs = p[P_BS]
    top = 0
    kv = 0
    for j in range(nrows):
        c = ctx[j]
        kv += c
        if c + 1 > top:
            top = c + 1
    kv += nrows
    beyond(S, p, top + k - 1)
    end = top + k
    m = 0
    if not p[P_REAL_KV]:
        while top < end:
            width = decode_width(p, sizes, nrows, top)
            stop = min(width + 1, end)
            counts[m] = stop - top
            prices[m] = np.int64(round(decode_x(p, f, coef, sizes, nrows, width, 0)))
            m += 1
            top = stop
        return m
    mean = ceil_div(kv, nrows)
    q = kv_quantum(mean, bs)
    rounded = ceil_div(mean, q) * q
    width = decode_width(p, sizes, nrows, top)
    while True:
        stop = min(width + 1, end, top + rounded - mean + 1)
        counts[m] = stop - top
        prices[m] = np.int64(round(decode_x(p, f, coef, sizes, nrows, width, nrows * rounded)))
        m += 1
        if stop == end:
            return m
        mean += stop - top
        top = stop
        if mean > rounded:
            q = kv_quantum(mean, bs)
            rounded = ceil_div(mean, q) * q
        if top > width:
            width = decode_width(p, sizes, nrows, top)

# --- the policy ---

@_njit
def on_arrivals(p, S, prompt, output, waiting, toolong, first, stop):
    for r in range(first, stop):
        total = prompt[r] + output[r]
        if total > p[P_MAX_LEN] or total - 1 > p[P_MAX_TOKENS_GPU]:
            most = min(p[P_MAX_LEN] - prompt[r], p[P_MAX_TOKENS_GPU] + 1 - prompt[r])
            if not p[P_CAPS] or most < 1:
                toolong[S[S_NTOOLONG]] = r
                S[S_NTOOLONG] += 1
                continue
            output[r] = most
            S[S_CAPPED] += 1
        if not p[P_CHUNKED] and prompt[r] > p[P_BUDGET]:
            toolong[S[S_NTOOLONG]] = r
            S[S_NTOOLONG] += 1
            continue
        waiting[S[S_WTAIL]] = r
        S[S_WTAIL] += 1

@_njit
def repeat_horizon(p, S, output, generated, rows, ctx, nrows, most, free):
    """PagedKV._repeat_horizon with ``most`` and ``free`` given."""
    if most <= 1:
        return 1
    bs = p[P_BS]
    if nrows * ((most - 1) // bs + 1) <= free:
        return most

    def extra(k):
        e = 0
        for j in range(nrows):
            e += ceil_div(ctx[j] + k, bs) - ceil_div(ctx[j] + 1, bs)
        return e

    if extra(most) <= free:
        return most
    lo, hi = 1, most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if extra(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo

@_njit
def schedule_once(p, S, prompt, output, computed, generated, cap, held, running, waiting,
                  rows, ntok, ctx, emit, nrows, pre, npre, info):
    """PagedKV._schedule_once (row by row) appending to rows.. from nrows and pre from npre;
    info: [nrows, npre, all_running, admitted, repeat, then_repeat, then_need, code]."""
    bs = p[P_BS]
    usable = p[P_USABLE]
    budget = p[P_BUDGET]
    threshold = p[P_THRESHOLD]
    first_row = nrows
    first_pre = npre
    running_at_start = S[S_NRUN]
    i = 0
    while i < S[S_NRUN] and budget > 0:
        r = running[i]
        c = computed[r]
        known = prompt[r] + generated[r]
        n = known - c
        if threshold and n > threshold:
            n = threshold
        if n > budget:
            n = budget
        end = c + n
        if end > cap[r]:
            grown = False
            while True:
                need = ceil_div(end, bs) - held[r]
                if need <= 0:
                    grown = True
                    break
                if need <= S[S_FREE]:
                    S[S_FREE] -= need
                    held[r] += need
                    grown = True
                    break
                if need + held[r] > usable:
                    info[7] = BAIL_KV
                    return
                S[S_NRUN] -= 1
                victim = running[S[S_NRUN]]
                if p[P_PREFIX]:
                    info[7] = BAIL_PREFIX
                    return
                S[S_PREEMPTIONS] += 1
                S[S_FREE] += held[victim]
                held[victim] = 0
                cap[victim] = 0
                computed[victim] = 0
                S[S_WHEAD] -= 1
                waiting[S[S_WHEAD]] = victim
                pre[npre] = victim
                npre += 1
                if victim == r:
                    break
            if grown:
                cap[r] = ceil_div(end, bs) * bs
        if end <= cap[r]:
            rows[nrows], ntok[nrows], ctx[nrows], emit[nrows] = r, n, c, end >= known
            nrows += 1
            budget -= n
            i += 1
            continue
        break
    all_running = i == S[S_NRUN]
    admitted = False
    if npre == first_pre:
        while S[S_WTAIL] > S[S_WHEAD] and budget > 0 and S[S_NRUN] < p[P_MAX_SEQS]:
            r = waiting[S[S_WHEAD]]
            known = prompt[r] + generated[r]
            n = known
            if threshold and n > threshold:
                n = threshold
            if n > budget:
                if not p[P_CHUNKED]:
                    break
                n = budget
            mark = p[P_WATERMARK] if S[S_NRUN] or not p[P_MARK_RUNNING] else 0
            total = ceil_div(n, bs)
            if total > usable:
                info[7] = BAIL_KV
                return
            whole = max(total, ceil_div(known, bs) if p[P_FULL_ISL] else 0)
            if whole > usable or whole + mark > S[S_FREE]:
                break
            S[S_FREE] -= total
            held[r] = total
            S[S_WHEAD] += 1
            running[S[S_NRUN]] = r
            S[S_NRUN] += 1
            computed[r] = 0
            cap[r] = total * bs
            rows[nrows], ntok[nrows], ctx[nrows], emit[nrows] = r, n, 0, n == known
            nrows += 1
            budget -= n
            admitted = True
    repeat = 1
    mine = nrows - first_row
    if mine and all_running and npre == first_pre and not admitted:
        decode = True
        for j in range(first_row, nrows):
            if ntok[j] != 1 or not emit[j]:
                decode = False
                break
        if decode:
            most = output[rows[first_row]] - generated[rows[first_row]]
            for j in range(first_row + 1, nrows):
                most = min(most, output[rows[j]] - generated[rows[j]])
            repeat = repeat_horizon(p, S, output, generated, rows[first_row:], ctx[first_row:], mine, most,
                                    S[S_FREE])
    info[0], info[1], info[2], info[3], info[4] = nrows, npre, all_running, admitted, repeat
    info[5] = info[6] = 0
    # Step.then: the decode run after a step of a few rows, all emitting, nothing waiting.
    if (npre == first_pre and p[P_DECODE_AFTER] and running_at_start < p[P_VECTOR_ROWS] and repeat == 1
            and all_running and S[S_WTAIL] == S[S_WHEAD] and mine and mine < p[P_VECTOR_ROWS]
            and mine <= p[P_BUDGET]):
        for j in range(first_row, nrows):
            if not emit[j]:
                return
        most = output[rows[first_row]] - generated[rows[first_row]]
        for j in range(first_row + 1, nrows):
            most = min(most, output[rows[j]] - generated[rows[j]])
        most -= 1
        if most < 2:
            return
        need = 0
        for j in range(first_row, nrows):
            if ctx[j] + ntok[j] + 1 > cap[rows[j]]:
                need += 1
        free = S[S_FREE] - need
        if free < 0:
            return
        after = ctx[first_row:nrows] + ntok[first_row:nrows]
        then_repeat = repeat_horizon(p, S, output, generated, rows[first_row:], after, mine, most, free)
        if then_repeat >= 2:
            info[5], info[6] = then_repeat, need

@_njit
def step_done(p, S, output, computed, generated, cap, held, running, rows, ntok, ctx, emit, nrows, repeats):
    """PagedKV.on_step_done of a step without Step.then (row by row)."""
    bs = p[P_BS]
    if repeats > 1:
        for j in range(nrows):
            r = rows[j]
            grow = ceil_div(ctx[j] + repeats, bs) - ceil_div(ctx[j] + 1, bs)
            S[S_FREE] -= grow
            held[r] += grow
            c = computed[r] = computed[r] + repeats
            generated[r] += repeats
            if c > cap[r]:
                cap[r] = ceil_div(c, bs) * bs
    else:
        for j in range(nrows):
            r = rows[j]
            computed[r] += ntok[j]
            if emit[j]:
                generated[r] += 1
    finished = 0
    for j in range(nrows):
        r = rows[j]
        if generated[r] >= output[r]:
            finished += 1
            S[S_FREE] += held[r]
            held[r] = 0
            cap[r] = 0
    if finished:
        k = 0
        for j in range(S[S_NRUN]):
            r = running[j]
            if generated[r] < output[r]:
                running[k] = r
                k += 1
        S[S_NRUN] = k

@_njit
def grow_i8(a, need):
    if need <= a.shape[0]:
        return a
    b = np.empty(max(need, 2 * a.shape[0]), a.dtype)
    b[:a.shape[0]] = a
    return b

# --- the driver ---

@_njit
def deliver(p, S, arrivals, prompt, output, waiting, toolong, until):
    first = S[S_DELIVERED]
    stop = first + 1
    while arrivals[stop] <= until:
        stop += 1
    S[S_DELIVERED] = stop
    S[S_NEXT] = arrivals[stop]
    on_arrivals(p, S, prompt, output, waiting, toolong, first, stop)

@_njit
def run_decode(p, f, coef, sizes, S, arrivals, prompt, output, waiting, toolong, ctx, nrows, repeats, now,
               arrivals_wait, counts, prices, run_prices, run_counts):
    """_Driver._run: (steps run, total, first step's price, and the buffers, grown where needed)."""
    if counts.shape[0] <= repeats:   # a run has at most one price segment per step
        counts = np.zeros(2 * repeats, np.int64)
        prices = np.zeros(2 * repeats, np.int64)
    m = run_segments(p, f, coef, sizes, S, ctx, nrows, repeats, counts, prices)
    if p[P_ASYNC]:
        h = host_ns(f, nrows)
        for j in range(m):
            prices[j] = max(prices[j] - h, h)
    price = prices[0]
    if m == 1 and price > 0:
        while S[S_NEXT] < NEVER:
            cut = (S[S_NEXT] - now - 1) // price + 1
            if cut >= repeats:
                break
            if arrivals_wait:
                before = S[S_NTOOLONG]
                deliver(p, S, arrivals, prompt, output, waiting, toolong, now + cut * price)
                if S[S_NTOOLONG] == before:
                    continue
            repeats = cut
            break
        total = price * repeats
        if repeats > 1:
            run_prices = grow_i8(run_prices, S[S_NRUNS] + 1)
            run_counts = grow_i8(run_counts, S[S_NRUNS] + 1)
            run_prices[S[S_NRUNS]] = price
            run_counts[S[S_NRUNS]] = repeats - 1
            S[S_NRUNS] += 1
        return repeats, total, price, run_prices, run_counts, counts, prices
    # _walk_segments
    nxt = S[S_NEXT]
    limit = nxt - now if nxt < NEVER else -1
    taken = total = 0
    first = S[S_NRUNS]
    last = m - 1
    for i in range(m):
        c, pr = counts[i], prices[i]
        stop = False
        while limit >= 0 and total + c * pr >= limit:
            k = max(1, (limit - total + pr - 1) // pr) if pr > 0 else 1
            if i == last and k == c:
                break
            if arrivals_wait:
                before = S[S_NTOOLONG]
                deliver(p, S, arrivals, prompt, output, waiting, toolong, now + total + k * pr)
                if S[S_NTOOLONG] == before:
                    nxt = S[S_NEXT]
                    limit = nxt - now if nxt < NEVER else -1
                    continue
            c, stop = k, True
            break
        run_prices = grow_i8(run_prices, S[S_NRUNS] + 1)
        run_counts = grow_i8(run_counts, S[S_NRUNS] + 1)
        run_prices[S[S_NRUNS]] = pr
        run_counts[S[S_NRUNS]] = c
        S[S_NRUNS] += 1
        taken += c
        total += c * pr
        if stop:
            break
    run_counts[first] -= 1
    return taken, total, price, run_prices, run_counts, counts, prices

@_njit
def kernel(p, f, coef, sizes, warm, arrival_ns, prompt, output):
    n = arrival_ns.shape[0]
    output = output.copy()
    bs = p[P_BS]
    S = np.zeros(S_LEN, np.int64)
    S[S_FREE] = p[P_USABLE]
    S[S_WHEAD] = S[S_WTAIL] = n + 1
    S[S_BEYOND] = -1
    arrivals = np.empty(n + 1, np.int64)
    arrivals[:n] = arrival_ns
    arrivals[n] = NEVER
    S[S_NEXT] = arrivals[0]
    computed = np.zeros(n, np.int64)
    generated = np.zeros(n, np.int64)
    cap = np.zeros(n, np.int64)
    held = np.zeros(n, np.int64)
    running = np.zeros(n + 1, np.int64)
    waiting = np.zeros(2 * n + 2, np.int64)
    toolong = np.zeros(n + 1, np.int64)
    seen = np.zeros(p[P_BUDGET] + 1, np.bool_)
    for t in warm:
        seen[t] = True
    rows = np.zeros(2 * n + 2, np.int64)
    ntok = np.zeros(2 * n + 2, np.int64)
    ctx = np.zeros(2 * n + 2, np.int64)
    emit = np.zeros(2 * n + 2, np.bool_)
    pre = np.zeros(2 * n + 2, np.int64)
    info = np.zeros(8, np.int64)
    counts = np.zeros(64, np.int64)
    prices = np.zeros(64, np.int64)
    log = np.zeros((1024, LOG_FIELDS), np.int64)
    col_rows = np.zeros(4096, np.int32)   # (requests and tokens fit 32 bits: covered() checks)
    col_ntok = np.zeros(4096, np.int32)
    col_emit = np.zeros(4096, np.bool_)
    run_prices = np.zeros(1024, np.int64)
    run_counts = np.zeros(1024, np.int64)
    preemptions = np.zeros(n, np.int32)
    rej_rows = np.zeros(16, np.int64)
    rej_ns = np.zeros(16, np.int64)
    code = OK
    now = arrivals[0] if n else 0
    while n:
        if S[S_NEXT] <= now:
            deliver(p, S, arrivals, prompt, output, waiting, toolong, now)
        # PagedKV.schedule: again while a step preempts everything it had.
        nrows = npre = 0
        while True:
            info[7] = OK
            schedule_once(p, S, prompt, output, computed, generated, cap, held, running, waiting,
                          rows, ntok, ctx, emit, nrows, pre, npre, info)
            if info[7] != OK:
                code = info[7]
                break
            if S[S_NTOOLONG]:
                need = S[S_NREJ] + S[S_NTOOLONG]
                rej_rows = grow_i8(rej_rows, need)
                rej_ns = grow_i8(rej_ns, need)
                for j in range(S[S_NTOOLONG]):
                    rej_rows[S[S_NREJ] + j] = toolong[j]
                    rej_ns[S[S_NREJ] + j] = now
                S[S_NREJ] = need
                S[S_NTOOLONG] = 0
            nrows, npre = info[0], info[1]
            if nrows or not npre:
                break
        if code != OK:
            break
        if not nrows:
            if S[S_NEXT] < NEVER:
                now = S[S_NEXT]
                continue
            break
        for j in range(npre):   # (once per step, as the driver's fancy-indexed += counts)
            r = pre[j]
            again = False
            for k in range(j):
                again = again or pre[k] == r
            if not again:
                preemptions[r] += 1
        repeat, then_repeat, then_need = info[4], info[5], info[6]
        arrivals_wait = repeat > 1 and S[S_WTAIL] > S[S_WHEAD]
        kv_used = p[P_USABLE] - S[S_FREE]
        waiting_now = S[S_WTAIL] - S[S_WHEAD]
        if repeat > 1:
            repeats, total, first, run_prices, run_counts, counts, prices = run_decode(
                p, f, coef, sizes, S, arrivals, prompt, output, waiting, toolong, ctx, nrows, repeat, now,
                arrivals_wait, counts, prices, run_prices, run_counts)
        else:
            repeats = 1
            total = step_ns(p, f, coef, sizes, S, seen, ntok, ctx, nrows)
            if p[P_ASYNC]:
                h = host_ns(f, nrows)
                total = max(total - h, h)
            first = total
        nlog = S[S_NLOG]
        if nlog + 2 > log.shape[0]:
            bigger = np.zeros((2 * log.shape[0], LOG_FIELDS), np.int64)
            bigger[:nlog] = log[:nlog]
            log = bigger
        ncol = S[S_NCOL]
        if ncol + 2 * nrows > col_rows.shape[0]:
            size = max(2 * col_rows.shape[0], ncol + 2 * nrows)
            col_rows, col_ntok, col_emit = (grow_i8(col_rows, size), grow_i8(col_ntok, size),
                                            grow_i8(col_emit, size))
        log[nlog, 0], log[nlog, 1], log[nlog, 2], log[nlog, 3] = now, now + total, now + first, repeats
        log[nlog, 4], log[nlog, 5], log[nlog, 6], log[nlog, 7] = nrows, kv_used, waiting_now, npre
        col_rows[ncol:ncol + nrows] = rows[:nrows]
        col_ntok[ncol:ncol + nrows] = ntok[:nrows]
        col_emit[ncol:ncol + nrows] = emit[:nrows]
        S[S_NLOG] = nlog = nlog + 1
        S[S_NCOL] = ncol = ncol + nrows
        more = 0
        if then_repeat and repeats == 1 and S[S_NEXT] > now + total:
            start = now + total
            after = ctx[:nrows] + ntok[:nrows]
            more, run_total, then_first, run_prices, run_counts, counts, prices = run_decode(
                p, f, coef, sizes, S, arrivals, prompt, output, waiting, toolong, after, nrows, then_repeat,
                start, False, counts, prices, run_prices, run_counts)
            log[nlog, 0], log[nlog, 1], log[nlog, 2], log[nlog, 3] = (start, start + run_total,
                                                                      start + then_first, more)
            log[nlog, 4], log[nlog, 5], log[nlog, 6], log[nlog, 7] = nrows, kv_used + then_need, 0, 0
            col_rows[ncol:ncol + nrows] = rows[:nrows]
            col_ntok[ncol:ncol + nrows] = 1
            col_emit[ncol:ncol + nrows] = True
            S[S_NLOG] = nlog + 1
            S[S_NCOL] = ncol + nrows
            repeats += more
            total += run_total
        now += total
        # PagedKV.on_step_done
        if more:
            step_done(p, S, output, computed, generated, cap, held, running, rows, ntok, ctx, emit, nrows, 1)
            for j in range(nrows):   # _take_first_blocks
                r = rows[j]
                c = ctx[j] + ntok[j]
                if c + 1 > cap[r]:
                    grow = ceil_div(c + 1, bs) - held[r]
                    if grow > 0:
                        S[S_FREE] -= grow
                        held[r] += grow
                    cap[r] = ceil_div(c + 1, bs) * bs
                ctx[j] = c
                ntok[j] = 1
                emit[j] = True
            step_done(p, S, output, computed, generated, cap, held, running, rows, ntok, ctx, emit, nrows,
                      repeats - 1)
        else:
            step_done(p, S, output, computed, generated, cap, held, running, rows, ntok, ctx, emit, nrows,
                      repeats)
    return (code, S, log, col_rows, col_ntok, col_emit, run_prices, run_counts, preemptions, rej_rows, rej_ns,
            output, seen)


@_njit
def summarize_log(n, rows, ntok, emits, sizes, start, first_end, end, repeats, measured):
    """From the replay's step log: :func:`~schedsim.core.llm_results.token_times`'s arrays
    (the same values, in the same order), each record's emitting rows (all, and those of
    ``measured`` requests) and its tokens and prefill tokens (``step_token_sums``)."""
    nrec = sizes.shape[0]
    first_seen = np.full(n, -1, np.int64)
    last_seen = np.full(n, -1, np.int64)
    first_token = np.full(n, -1, np.int64)
    last_token = np.full(n, -1, np.int64)
    last_emit_rec = np.full(n, -1, np.int64)
    tokens_out = np.zeros(n, np.int64)
    per_row = np.zeros(n, np.int64)
    emitting = np.zeros(nrec, np.int64)
    emitting_measured = np.zeros(nrec, np.int64)
    tok = np.zeros(nrec, np.int64)
    pre = np.zeros(nrec, np.int64)
    j = 0
    for k in range(nrec):
        for _ in range(sizes[k]):
            r = rows[j]
            q = ntok[j]
            tok[k] += q
            if q > 1:
                pre[k] += q
            if first_seen[r] < 0:
                first_seen[r] = k
            last_seen[r] = k
            if emits[j]:
                emitting[k] += 1
                if measured[r]:
                    emitting_measured[k] += 1
                per_row[r] += 1
                tokens_out[r] += repeats[k]
                if first_token[r] < 0:
                    first_token[r] = first_end[k]
                last_token[r] = end[k]
                last_emit_rec[r] = k
            j += 1
    # Gaps grouped by request, each group in time order: where each group starts, then a pass.
    offsets = np.zeros(n + 1, np.int64)
    for r in range(n):
        offsets[r + 1] = offsets[r] + max(per_row[r] - 1, 0)
    gaps = np.empty(offsets[n], np.int64)
    gap_rows = np.empty(offsets[n], np.int32)
    fill = offsets[:n].copy()
    previous = np.full(n, -1, np.int64)
    j = 0
    for k in range(nrec):
        for _ in range(sizes[k]):
            if emits[j]:
                r = rows[j]
                if previous[r] >= 0:
                    gaps[fill[r]] = first_end[k] - end[previous[r]]
                    gap_rows[fill[r]] = r
                    fill[r] += 1
                previous[r] = k
            j += 1
    scheduled = np.full(n, -1, np.int64)
    for r in range(n):
        if first_seen[r] >= 0:
            scheduled[r] = start[first_seen[r]]
    return (first_seen, last_seen, scheduled, first_token, last_token, last_emit_rec, tokens_out, gaps, gap_rows,
            emitting, emitting_measured, tok, pre)


_KERNEL = kernel
