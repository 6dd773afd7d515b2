"""``paged-kv`` replayed in compiled code: the same steps, records and prices, 2-25x faster.

A busy engine decides a step for nearly every arrival and finish, and each decision walks
its running rows: in Python that costs 50-100 us an event, whatever is vectorised. This
module replays :class:`~policies.paged_kv.PagedKV` (row by row, as its reference loop
does), its :class:`~policies.kv_cache.KVCacheManager` (free queue, prefix cache, shared
blocks), :func:`~schedsim.core.llm_simulate.simulate_llm`'s driver (folded decode runs, cut
at arrivals by division, runs past arrivals that only wait, the decode run a step carries)
and :class:`~schedsim.cost.step_model.StepCostModel`'s prices, compiled with numba, and
hands the driver the step log it would have written. The result is the same bit for bit:
``tests/unit/policies/test_paged_kv_compiled.py`` checks it against the Python path on
random traces and settings.

Where no block can be found by its key (prefix caching off, or no prefix shared between
requests and no preemption), the block manager reduces to counts of blocks held, and the
replay keeps only those; a preemption under prefix caching makes the victim's blocks
findable, and the replay runs again keeping block ids. Covered: first-come first-served,
recompute preemption, no speculative decoding, no ``max_num_partial_prefills``, a PagedKV
itself (a subclass may decide otherwise) priced by a StepCostModel of the policy's block
size. Anything else runs in Python (:func:`replay` answers None). Without numba,
everything does.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from policies.llm_common import hash_keyed_blocks
from schedsim.core.policy import NEVER
from schedsim.cost.llm_shapes import MIN_GRAPH_CONTEXT_BLOCKS
from schedsim.cost.step_fit import EAGER_KNEE_TOKENS, GRAPH_CLASSES, GRAPH_TERMS, KV_STEPS_PER_OCTAVE

try:
    import numba
    from numba.typed import List
except ImportError:   # pragma: no cover - numba is a dependency; a stripped install runs in Python
    numba = None

# --- parameters and state (int64 arrays indexed by these names) -----------------------------------

(P_BS, P_BUDGET, P_MAX_SEQS, P_THRESHOLD, P_CHUNKED, P_PREFIX, P_FULL_ISL, P_WATERMARK, P_MARK_RUNNING,
 P_CAPS, P_MAX_LEN, P_MAX_TOKENS_GPU, P_USABLE, P_DECODE_AFTER, P_VECTOR_ROWS, P_ASYNC, P_GRAPHS,
 P_REAL_KV, P_SERIAL, P_KV_HEADS, P_SPLIT_CTAS, P_MIN_SPLIT, P_WAVE, P_MAX_MEASURED,
 P_FIRST_CALL, P_TRACKS_FULL, P_LOOKUP_EVERY, P_UNHASHED_FIRST, P_PER_ID, P_N, P_BLOCKS, P_LEN) = range(32)
"""Integer parameters of the policy and the cost model."""

(F_OVERHEAD, F_LOOP_A, F_LOOP_B, F_FIRST_CALL, F_LEN) = range(5)
"""Float parameters of the cost model (ns)."""

(S_FREE, S_NRUN, S_WHEAD, S_WTAIL, S_CAPPED, S_PREEMPTIONS, S_NTOOLONG, S_DELIVERED, S_NEXT, S_BEYOND,
 S_NLOG, S_NCOL, S_NRUNS, S_NREJ, S_NSHARED, S_POOL_TOP, S_LEN) = range(17)
"""Scalar state: free blocks, running and waiting counts, counters, log lengths, blocks with
more than one holder, the block-table pool's first unused entry."""

(B_NXT, B_PRV, B_KEY, B_KEYED, B_REF, B_DNXT, B_DPRV, B_DTAIL, B_LEN) = range(9)
"""Per block: the free queue's links (a doubly linked list; the sentinel is the last
column), its cache key and whether it has one, its holders (keyed blocks only), and the
chain of blocks cached under its key, the one lookups return first, then KVCacheManager's
dups oldest first (links, and for the first, the chain's last), -1 where none."""

(T_START, T_LEN, T_CAP, T_NCACHED, T_FULL, T_SHARED, T_KEYED, T_HASH_LO, T_ADMITTED, T_HITS,
 T_FIELDS) = range(11)
"""Per request: its block table (start, length and capacity in the pool), leading blocks
registered, PagedKV's ``full`` and ``shared``, BlockKeys.shared (leading blocks keyed by
hash ids) and where its hash ids start, whether it was admitted before, its prefix hits."""

KEY_BLOCKS = 1 << 24
"""Block indices per key family here: the key of (family, block j) is
``(family + requests + 1) * KEY_BLOCKS + j``; equal exactly when the pairs are, as
BlockKeys' keys (which the dict's order never depends on)."""

OK, BAIL_BLOCKS, BAIL_KV = 0, 1, 2
"""How a replay ends: done; a preemption with prefix caching while keeping block counts only
(its blocks become findable by key: replay again with block ids); a request that needs more
blocks than exist (the Python path raises KVCacheError)."""

LOG_FIELDS = 8
EAGER_TERMS = 9
"""eager_features' terms before the optional ones (serial keys, real KV): step_fit.FEATURES
holds GRAPH_TERMS graph features, then these."""


def replay(policy, requests, cost) -> dict | None:
    """Run ``policy`` (reset for ``requests``) over ``requests`` priced by ``cost``, compiled;
    the driver's log and what the policy and cost model hold at the end, or None where the
    run is not covered (module docstring): nothing has changed then."""
    if numba is None or not covered(policy, cost):
        return None
    params, fparams, coef, graph_sizes, warm = _params(policy, cost)
    if sys.stderr.isatty() and _compiles_first():
        print("schedsim: compiling paged-kv's replay for this machine (once; under a minute)", file=sys.stderr)
    args = (params, fparams, coef, graph_sizes, warm, np.ascontiguousarray(requests.arrival_ns, np.int64),
            np.asarray(policy.p.prompt, np.int64), np.asarray(policy.p.output, np.int64),
            *_keys(policy, requests), np.ascontiguousarray(policy._shared, np.int64), policy.kv.num_blocks)
    # Block ids matter only where a block can be found by its key: a prefix others share, or
    # a preempted request's own blocks. Otherwise counts decide alike, at about half the cost.
    params[P_BLOCKS] = policy.prefix_caching and bool(policy._shared.any())
    out = _KERNEL(*args)
    if out[0] == BAIL_BLOCKS:
        params[P_BLOCKS] = 1
        out = _KERNEL(*args)
    (code, state, log, rows, ntok, emits, run_prices, run_counts, preemptions, rej_rows, rej_ns, output, seen,
     hits) = out
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
            "beyond": int(state[S_BEYOND]), "prefix_hit_tokens": hits}


def _keys(policy, requests) -> tuple:
    """(hash ids, BlockKeys.shared per request, where each request's hash ids start):
    what key_of needs to restate BlockKeys."""
    n = len(requests)
    if requests.hash_ids is None or not n:
        return np.zeros(1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    ids = np.asarray(requests.hash_ids, np.int64)
    return (ids if ids.size else np.zeros(1, np.int64), hash_keyed_blocks(requests, policy.block_size),
            np.asarray(requests.hash_offsets[:-1], np.int64))


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
    change what it decides: :meth:`PagedKV.replay_compiled` checks), reset, priced by ``cost``
    (module docstring)."""
    from schedsim.cost.step_model import StepCostModel

    if type(cost) is not StepCostModel:
        return False
    if (policy.swap or policy.priority or policy.k or policy.max_partial or not policy.DECODE_AFTER
            or policy.waiting or policy.running):
        return False
    req = policy.requests
    if req.hash_ids is not None and len(req.hash_ids):
        ids = np.asarray(req.hash_ids)
        if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= 1 << 37:
            return False   # (keys here pack (hash id, block) into 64 bits)
        if int(req.hash_block_tokens) < 1:
            return False
    if policy.max_len // policy.block_size + 2 >= KEY_BLOCKS:
        return False
    if cost._eager_coef is None or cost._gpu_bound or cost.draft is not None:
        return False
    if len(policy.requests) >= 1 << 30 or policy.max_num_batched_tokens >= 1 << 31:
        return False   # (the step log keeps rows and token counts in 32 bits)
    return cost.block_size == policy.block_size   # (prices here use the policy's block size)


def _params(policy, cost) -> tuple:
    att = cost._attention
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
    p[P_FIRST_CALL] = bool(cost.first_call_ns)
    p[P_TRACKS_FULL] = policy._tracks_full
    p[P_LOOKUP_EVERY] = policy.LOOKUP_EVERY_ADMISSION
    p[P_UNHASHED_FIRST] = policy.free_unhashed_first
    p[P_PER_ID] = int(policy.requests.hash_block_tokens) if policy.requests.hash_ids is not None else 1
    p[P_N] = len(policy.requests)
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
    policy.hit_tokens = result["prefix_hit_tokens"]
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
        return max(MIN_GRAPH_CONTEXT_BLOCKS, 1 << bit_length(blocks - 1)) * bs
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
    return max((1 << bit_length(mean - 1)) // KV_STEPS_PER_OCTAVE, bs)


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
        i = 2
        for lo, hi in GRAPH_CLASSES:
            t = t + coef[i] * (gathered * ((padded >= lo) * (padded <= hi)))
            i += 1
        for j in range(EAGER_TERMS):   # the eager features, all zero
            t = t + coef[i + j] * 0
        return t
    for i in range(GRAPH_TERMS):   # the graph features, all zero
        t = t + coef[i] * 0
    e = GRAPH_TERMS
    t = t + coef[e] * 1
    t = t + coef[e + 1] * n
    t = t + coef[e + 2] * 0
    t = t + coef[e + 3] * 0
    t = t + coef[e + 4] * 0
    t = t + coef[e + 5] * n
    t = t + coef[e + 6] * (n * width)
    t = t + coef[e + 7] * (1 if n > 0 else 0)
    t = t + coef[e + 8] * ((n - EAGER_KNEE_TOKENS) if n > EAGER_KNEE_TOKENS else 0)
    if p[P_SERIAL]:
        t = t + coef[e + EAGER_TERMS] * serial_keys(p, n, width)
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
        e = GRAPH_TERMS
        t = 0.0
        t = t + coef[e] * 1
        t = t + coef[e + 1] * tokens
        t = t + coef[e + 2] * (nrows - nd)
        t = t + coef[e + 3] * attention
        t = t + coef[e + 4] * pctx
        t = t + coef[e + 5] * nd
        t = t + coef[e + 6] * (nd * dwidth)
        t = t + coef[e + 7] * (1 if nd > 0 else 0)
        t = t + coef[e + 8] * ((tokens - EAGER_KNEE_TOKENS) if tokens > EAGER_KNEE_TOKENS else 0)
        k = e + EAGER_TERMS
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


# --- the block manager (KVCacheManager, block by block) ---

@_njit
def fq_push_back(B, b):
    h = B.shape[0] - 1
    last = B[h, B_PRV]
    B[last, B_NXT] = b
    B[b, B_PRV] = last
    B[b, B_NXT] = h
    B[h, B_PRV] = b


@_njit
def fq_push_front(B, b):
    h = B.shape[0] - 1
    first = B[h, B_NXT]
    B[first, B_PRV] = b
    B[b, B_NXT] = first
    B[b, B_PRV] = h
    B[h, B_NXT] = b


@_njit
def fq_unlink(B, b):
    before, after = B[b, B_PRV], B[b, B_NXT]
    B[before, B_NXT] = after
    B[after, B_PRV] = before


@_njit
def key_of(p, T, hash_ids, r, j):
    """BlockKeys(requests, r, block_size)[j], restated (see KEY_BLOCKS)."""
    if j < T[T_KEYED, r]:
        family = hash_ids[T[T_HASH_LO, r] + ((j + 1) * p[P_BS] - 1) // p[P_PER_ID]]
    else:
        family = -1 - r
    return (family + p[P_N] + 1) * KEY_BLOCKS + j


@_njit
def mix(key):
    """A bijection of 64-bit keys (splitmix64's finaliser): consecutive keys spread over the
    hash table's slots."""
    z = np.uint64(key)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return np.int64(z ^ (z >> np.uint64(31)))


@_njit
def h_slot(H, key):
    """Where ``key`` is in the open-addressing table H (keys in row 0, -1 empty; linear
    probing), or -1 - the empty slot where it would go."""
    mask = H.shape[1] - 1
    i = mix(key) & mask
    while H[0, i] != -1:
        if H[0, i] == key:
            return i
        i = (i + 1) & mask
    return -1 - i


@_njit
def h_get(H, key):
    i = h_slot(H, key)
    return H[1, i] if i >= 0 else -1


@_njit
def h_set(H, key, value):
    i = h_slot(H, key)
    if i < 0:
        i = -1 - i
        H[0, i] = key
    H[1, i] = value


@_njit
def h_del(H, key):
    """Remove ``key`` (present), moving later entries of its probe run back (no tombstones)."""
    mask = H.shape[1] - 1
    i = h_slot(H, key)
    j = i
    while True:
        j = (j + 1) & mask
        if H[0, j] == -1:
            break
        home = mix(H[0, j]) & mask
        if (i < home <= j) if i <= j else (i < home or home <= j):
            continue   # its home lies after the hole: it stays
        H[0, i], H[1, i] = H[0, j], H[1, j]
        i = j
    H[0, i] = -1


@_njit
def uncache(B, H, b, k):
    """KVCacheManager._uncache: drop block b's key k; the next block with it takes over."""
    first = h_get(H, k)
    after = B[b, B_DNXT]
    if first == b:
        if after >= 0:
            h_set(H, k, after)
            B[after, B_DPRV] = -1
            B[after, B_DTAIL] = B[b, B_DTAIL]
        else:
            h_del(H, k)
    else:
        before = B[b, B_DPRV]
        B[before, B_DNXT] = after
        if after >= 0:
            B[after, B_DPRV] = before
        else:
            B[first, B_DTAIL] = before
    B[b, B_DNXT] = B[b, B_DPRV] = B[b, B_DTAIL] = -1


@_njit
def table_reserve(T, pools, S, r, extra):
    """The pool, with room for ``extra`` more blocks in request r's table (grown, and the
    pool compacted, as needed)."""
    pool = pools[0]
    if T[T_LEN, r] + extra <= T[T_CAP, r]:
        return pool
    cap = max(16, 2 * T[T_CAP, r], T[T_LEN, r] + extra)
    m = T[T_LEN, r]
    if S[S_POOL_TOP] + cap > pool.shape[0]:   # move every live table down into a fresh pool
        live = 0
        for q in range(T.shape[1]):
            if T[T_CAP, q] and q != r:
                live += T[T_LEN, q] + 8
        fresh = np.empty(2 * (live + cap) + (1 << 16), np.int64)
        top = 0
        for q in range(T.shape[1]):
            if T[T_CAP, q] and q != r:
                k = T[T_LEN, q]
                fresh[top:top + k] = pool[T[T_START, q]:T[T_START, q] + k]
                T[T_START, q] = top
                T[T_CAP, q] = k + 8
                top += k + 8
        fresh[top:top + m] = pool[T[T_START, r]:T[T_START, r] + m]
        S[S_POOL_TOP] = top
        pools[0] = pool = fresh
    else:
        top = S[S_POOL_TOP]
        pool[top:top + m] = pool[T[T_START, r]:T[T_START, r] + m]
    T[T_START, r] = S[S_POOL_TOP]
    S[S_POOL_TOP] += cap
    T[T_CAP, r] = cap
    return pool


@_njit
def take(p, B, T, pools, H, S, r, m):
    """KVCacheManager._take: m blocks from the free queue's head onto r's table; a cached
    block taken loses its key."""
    if not p[P_BLOCKS]:   # block counts only
        S[S_FREE] -= m
        T[T_LEN, r] += m
        return
    pool = table_reserve(T, pools, S, r, m)
    at = T[T_START, r] + T[T_LEN, r]
    h = B.shape[0] - 1
    for i in range(m):
        b = B[h, B_NXT]
        fq_unlink(B, b)
        if B[b, B_KEYED]:
            B[b, B_KEYED] = 0
            uncache(B, H, b, B[b, B_KEY])
        pool[at + i] = b
    S[S_FREE] -= m
    T[T_LEN, r] += m


@_njit
def cache_blocks(p, B, T, pools, H, hash_ids, r, num_full):
    """KVCacheManager.cache_blocks of r's first num_full blocks under BlockKeys(r)."""
    if not p[P_PREFIX] or not p[P_BLOCKS]:
        return
    start = T[T_NCACHED, r]
    if num_full <= start:
        return
    pool = pools[0]
    base = T[T_START, r]
    for j in range(start, num_full):
        b = pool[base + j]
        k = key_of(p, T, hash_ids, r, j)
        first = h_get(H, k)
        if first >= 0:   # another block has the key: this one joins the end of its chain
            last = B[first, B_DTAIL]
            B[last, B_DNXT] = b
            B[b, B_DPRV] = last
            B[first, B_DTAIL] = b
        else:
            h_set(H, k, b)
            B[b, B_DTAIL] = b
        B[b, B_KEY] = k
        B[b, B_KEYED] = 1
        B[b, B_REF] = 1
    T[T_NCACHED, r] = num_full


@_njit
def free_blocks(p, B, T, pools, S, r, num_hashed):
    """KVCacheManager.free(r, num_hashed): blocks reaching no holder go back to the free
    queue, unkeyed ones past the hashed to its head (free_unhashed_first), the rest to its
    tail, tail blocks first."""
    pool = pools[0]
    base, m, num_cached = T[T_START, r], T[T_LEN, r], T[T_NCACHED, r]
    T[T_LEN, r] = T[T_CAP, r] = T[T_NCACHED, r] = 0
    if not p[P_BLOCKS]:
        S[S_FREE] += m
        return
    if not p[P_PREFIX]:
        if p[P_UNHASHED_FIRST]:
            for i in range(m):
                fq_push_front(B, pool[base + i])
        else:
            for i in range(m - 1, -1, -1):
                fq_push_back(B, pool[base + i])
        S[S_FREE] += m
        return
    cut = min(max(num_hashed, num_cached), m) if p[P_UNHASHED_FIRST] else m
    for i in range(cut, m):
        fq_push_front(B, pool[base + i])
    S[S_FREE] += m - cut
    shared = S[S_NSHARED]
    for i in range(cut - 1, -1, -1):
        b = pool[base + i]
        if i < num_cached:
            refs = B[b, B_REF]
            B[b, B_REF] = refs - 1 if shared else 0
            if shared and refs == 2:
                S[S_NSHARED] -= 1
            if shared and refs != 1:
                continue   # still held by another request
        fq_push_back(B, b)
        S[S_FREE] += 1


@_njit
def allocate_new(p, B, T, pools, H, hash_ids, S, r, num_tokens, hits, mark, full_tokens):
    """KVCacheManager.allocate for a request with no blocks: the new blocks taken; -1 where
    they do not fit (nothing changed); -2 where it needs more blocks than exist."""
    bs = p[P_BS]
    total = ceil_div(num_tokens, bs)
    if total > p[P_USABLE]:
        return -2
    nhit = hits // bs
    evictable = 0
    for j in range(nhit):
        if B[h_get(H, key_of(p, T, hash_ids, r, j)), B_REF] == 0:
            evictable += 1
    need = total - nhit
    whole = max(total, ceil_div(full_tokens, bs))
    if whole > p[P_USABLE] or whole - nhit + evictable + mark > S[S_FREE]:
        return -1
    pool = table_reserve(T, pools, S, r, nhit)
    for j in range(nhit):
        b = h_get(H, key_of(p, T, hash_ids, r, j))
        refs = B[b, B_REF]
        if refs == 0:   # free, still cached: out of the queue's middle
            fq_unlink(B, b)
            S[S_FREE] -= 1
        elif refs == 1:
            S[S_NSHARED] += 1
        B[b, B_REF] = refs + 1
        pool[T[T_START, r] + j] = b
    T[T_LEN, r] = nhit
    take(p, B, T, pools, H, S, r, need)
    T[T_NCACHED, r] = nhit
    return need


@_njit
def computed_prefix(p, T, H, hash_ids, r, known):
    """KVCacheManager.computed_prefix of r's keys: cached tokens, at most known - 1."""
    limit = (known - 1) // p[P_BS]
    j = 0
    while j < limit and h_slot(H, key_of(p, T, hash_ids, r, j)) >= 0:
        j += 1
    return j * p[P_BS]


@_njit
def cache_full_blocks(p, B, T, pools, H, hash_ids, r, num_full):
    """PagedKV._cache_full_blocks: registers only the leading blocks others may share."""
    if num_full > T[T_FULL, r]:
        T[T_FULL, r] = num_full
        if T[T_SHARED, r]:
            cache_blocks(p, B, T, pools, H, hash_ids, r, min(num_full, T[T_SHARED, r]))


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
def preempt(p, B, T, pools, H, hash_ids, S, computed, cap, waiting, victim):
    """PagedKV._preempt, recompute: its full blocks cached under its keys, then freed; False
    where that needs block ids the replay does not keep (BAIL_BLOCKS)."""
    if p[P_PREFIX] and not p[P_BLOCKS]:
        return False
    S[S_PREEMPTIONS] += 1
    full = computed[victim] // p[P_BS]
    cache_blocks(p, B, T, pools, H, hash_ids, victim, full)
    free_blocks(p, B, T, pools, S, victim, full)
    cap[victim] = 0
    computed[victim] = 0
    S[S_WHEAD] -= 1
    waiting[S[S_WHEAD]] = victim
    return True


@_njit
def until_new_shared_keys(p, T, rows, ctx, nrows, horizon):
    """PagedKV._until_new_shared_keys."""
    bs = p[P_BS]
    for j in range(nrows):
        r = rows[j]
        if T[T_SHARED, r] > T[T_FULL, r]:
            k = (-ctx[j]) % bs
            if k == 0:
                k = bs
            if k == 1:
                k += bs
            horizon = min(horizon, k - 1)
    return max(horizon, 1)


@_njit
def schedule_once(p, B, T, pools, H, hash_ids, S, prompt, output, computed, generated, cap,
                  running, waiting, rows, ntok, ctx, emit, nrows, pre, npre, info):
    """PagedKV._schedule_once (row by row) appending to rows.. from nrows and pre from npre;
    info: [nrows, npre, all_running, admitted, repeat, then_repeat, then_need, code]."""
    bs = p[P_BS]
    usable = p[P_USABLE]
    budget = p[P_BUDGET]
    threshold = p[P_THRESHOLD]
    tracks_full = p[P_TRACKS_FULL]
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
                need = ceil_div(end, bs) - T[T_LEN, r]
                if need <= 0:
                    grown = True
                    break
                if need <= S[S_FREE]:
                    take(p, B, T, pools, H, S, r, need)
                    grown = True
                    break
                if need + T[T_LEN, r] > usable:
                    info[7] = BAIL_KV
                    return
                S[S_NRUN] -= 1
                victim = running[S[S_NRUN]]
                if not preempt(p, B, T, pools, H, hash_ids, S, computed, cap, waiting, victim):
                    info[7] = BAIL_BLOCKS
                    return
                pre[npre] = victim
                npre += 1
                if victim == r:
                    break
            if grown:
                cap[r] = ceil_div(end, bs) * bs
        if end <= cap[r]:
            if tracks_full and end // bs > c // bs:   # (only verified tokens are cached)
                cache_full_blocks(p, B, T, pools, H, hash_ids, r, min(end, known) // bs)
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
            hits = 0
            if p[P_PREFIX]:
                first = not T[T_ADMITTED, r]
                # A first admission with only its own keys looks up none (none is cached).
                if p[P_LOOKUP_EVERY] or not first or T[T_SHARED, r]:
                    hits = computed_prefix(p, T, H, hash_ids, r, known)
            n = known - hits
            if threshold and n > threshold:
                n = threshold
            if n > budget:
                if not p[P_CHUNKED]:
                    break
                n = budget
            mark = p[P_WATERMARK] if S[S_NRUN] or not p[P_MARK_RUNNING] else 0
            got = allocate_new(p, B, T, pools, H, hash_ids, S, r, hits + n, hits, mark,
                               known if p[P_FULL_ISL] else 0)
            if got == -2:
                info[7] = BAIL_KV
                return
            if got < 0:
                break
            if p[P_PREFIX]:
                T[T_FULL, r] = hits // bs
                if (hits + n) // bs > hits // bs:
                    cache_full_blocks(p, B, T, pools, H, hash_ids, r, (hits + n) // bs)
            S[S_WHEAD] += 1
            running[S[S_NRUN]] = r
            S[S_NRUN] += 1
            computed[r] = hits
            cap[r] = ceil_div(hits + n, bs) * bs
            if not T[T_ADMITTED, r]:
                T[T_ADMITTED, r] = 1
                T[T_HITS, r] = hits
            rows[nrows], ntok[nrows], ctx[nrows], emit[nrows] = r, n, hits, hits + n == known
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
            if repeat > 1 and p[P_FULL_ISL] and tracks_full and S[S_WTAIL] > S[S_WHEAD]:
                repeat = until_new_shared_keys(p, T, rows[first_row:], ctx[first_row:], mine, repeat)
    info[0], info[1], info[2], info[3], info[4] = nrows, npre, all_running, admitted, repeat
    info[5] = info[6] = 0
    # Step.then: the decode run after a step of a few rows, all emitting, nothing waiting.
    if (npre == first_pre and p[P_DECODE_AFTER] and running_at_start < p[P_VECTOR_ROWS] and repeat == 1
            and not tracks_full and all_running and S[S_WTAIL] == S[S_WHEAD] and mine
            and mine < p[P_VECTOR_ROWS] and mine <= p[P_BUDGET]):
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
def step_done(p, B, T, pools, H, hash_ids, S, output, computed, generated, cap, running,
              rows, ntok, ctx, emit, nrows, repeats, cycle):
    """PagedKV.on_step_done of a step without Step.then (row by row)."""
    bs = p[P_BS]
    if repeats > 1:
        # _replay_allocations: the blocks steps 2.. took, one at a time in step order: a round
        # robin over the rows ordered (stably) by the step at which each first opens a block.
        rounds, rest = divmod(repeats - 1, bs)
        total = rounds * nrows
        k = 0
        for first in range(1, bs + 1):
            for j in range(nrows):
                f = (-ctx[j]) % bs
                if f == 0:
                    f = bs
                if f == first:
                    cycle[k] = rows[j]
                    k += 1
                    if f <= rest:
                        total += 1
        for t in range(total):
            take(p, B, T, pools, H, S, cycle[t % nrows], 1)
        for j in range(nrows):
            r = rows[j]
            c = computed[r] = computed[r] + repeats
            generated[r] += repeats
            if c > cap[r]:
                cap[r] = ceil_div(c, bs) * bs
        if p[P_TRACKS_FULL]:   # what the run's steps registered one by one
            for j in range(nrows):
                r = rows[j]
                c = computed[r]
                if c // bs > T[T_FULL, r] and c // bs > (c - repeats) // bs and generated[r] < output[r]:
                    cache_full_blocks(p, B, T, pools, H, hash_ids, r, c // bs)
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
            if p[P_PREFIX]:
                cache_full_blocks(p, B, T, pools, H, hash_ids, r, computed[r] // bs)
            free_blocks(p, B, T, pools, S, r, T[T_FULL, r])
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
def grown(a, need):
    """``a``, or a copy twice as long (at least ``need``) where it is shorter than that."""
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
            run_prices = grown(run_prices, S[S_NRUNS] + 1)
            run_counts = grown(run_counts, S[S_NRUNS] + 1)
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
        run_prices = grown(run_prices, S[S_NRUNS] + 1)
        run_counts = grown(run_counts, S[S_NRUNS] + 1)
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
def kernel(p, f, coef, sizes, warm, arrival_ns, prompt, output, hash_ids, keyed, hash_lo, shared, num_blocks):
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
    # The block manager: every block but the null one (0) free, in order.
    # (Counts only: no block is ever looked at, and a short run need not fault in 26 MB.)
    listed = num_blocks if p[P_BLOCKS] else 2
    B = np.full((listed + 1, B_LEN), -1, np.int64)   # (a block's fields in one or two cache lines)
    B[:, B_KEYED] = 0
    B[:, B_REF] = 0
    h = listed   # the free queue's sentinel
    for b in range(1, listed):
        B[b, B_NXT], B[b, B_PRV] = b + 1, b - 1
    B[h, B_NXT], B[h, B_PRV] = 1, listed - 1
    B[listed - 1, B_NXT], B[1, B_PRV] = h, h
    T = np.zeros((T_FIELDS, n), np.int64)
    T[T_KEYED] = keyed
    T[T_HASH_LO] = hash_lo
    T[T_SHARED] = shared
    pools = List()
    pools.append(np.empty(1 << 16, np.int64))
    size = 1024
    while size < 2 * listed + 16:   # (at most one cached key per block: half full at most)
        size *= 2
    H = np.full((2, size), -1, np.int64)
    cycle = np.zeros(n + 1, np.int64)
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
            schedule_once(p, B, T, pools, H, hash_ids, S, prompt, output, computed,
                          generated, cap, running, waiting, rows, ntok, ctx, emit, nrows, pre, npre, info)
            if info[7] != OK:
                code = info[7]
                break
            if S[S_NTOOLONG]:
                need = S[S_NREJ] + S[S_NTOOLONG]
                rej_rows = grown(rej_rows, need)
                rej_ns = grown(rej_ns, need)
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
            col_rows, col_ntok, col_emit = (grown(col_rows, size), grown(col_ntok, size),
                                            grown(col_emit, size))
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
            step_done(p, B, T, pools, H, hash_ids, S, output, computed, generated, cap, running,
                      rows, ntok, ctx, emit, nrows, 1, cycle)
            for j in range(nrows):   # _take_first_blocks
                r = rows[j]
                c = ctx[j] + ntok[j]
                if c + 1 > cap[r]:
                    grow = ceil_div(c + 1, bs) - T[T_LEN, r]
                    if grow > 0:
                        take(p, B, T, pools, H, S, r, grow)
                    cap[r] = ceil_div(c + 1, bs) * bs
                ctx[j] = c
                ntok[j] = 1
                emit[j] = True
            step_done(p, B, T, pools, H, hash_ids, S, output, computed, generated, cap, running,
                      rows, ntok, ctx, emit, nrows, repeats - 1, cycle)
        else:
            step_done(p, B, T, pools, H, hash_ids, S, output, computed, generated, cap, running,
                      rows, ntok, ctx, emit, nrows, repeats, cycle)
    return (code, S, log, col_rows, col_ntok, col_emit, run_prices, run_counts, preemptions, rej_rows, rej_ns,
            output, seen, T[T_HITS].astype(np.int32))


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
