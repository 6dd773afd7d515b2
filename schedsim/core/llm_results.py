"""The result of an LLM run: per-request token times and the step log.

Both LLM drivers (the simulator and the live engine runner) fill this table; the
metrics in :mod:`schedsim.core.llm_metrics` are vector expressions over it. Row = request
everywhere; -1 means "did not happen".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schedsim.core.policy import Requests


@dataclass(eq=False)
class LLMResult:
    requests: Requests
    status: np.ndarray
    """int8 status codes of :mod:`schedsim.core.results` (COMPLETED, REJECTED_TOO_LONG, ...)."""
    scheduled_ns: np.ndarray
    """int64 when the request first ran in a step (its queueing ends), -1 if never."""
    first_token_ns: np.ndarray
    """int64 when its first output token was emitted, -1 if never."""
    end_ns: np.ndarray
    """int64 when its last output token was emitted (or when it was rejected), -1 if neither."""
    tokens_out: np.ndarray
    """int32 output tokens emitted."""
    preemptions: np.ndarray
    """int32 times the request was preempted."""
    prefix_hit_tokens: np.ndarray
    """int32 prompt tokens found in the prefix cache when it was (first) admitted."""
    itl_ns: np.ndarray
    """int64 inter-token gaps pooled over all requests (vLLM's ITL), as distinct values ..."""
    itl_count: np.ndarray
    """int64 ... each with how many gaps had that value (a step repeated k times for n
    requests contributes its duration n*(k-1) times)."""
    step_start_ns: np.ndarray
    """int64 start of each step record (a record may stand for several identical decode steps)."""
    step_end_ns: np.ndarray
    step_repeats: np.ndarray
    """int32 identical back-to-back steps in the record."""
    step_seqs: np.ndarray
    """int32 requests in the step."""
    step_tokens: np.ndarray
    """int32 tokens computed per step (prefill chunks plus decodes)."""
    step_prefill_tokens: np.ndarray
    """int32 of those tokens, the ones in prefill chunks (rows computing more than one token)."""
    step_kv_blocks: np.ndarray
    """int32 GPU KV blocks in use during the step (at the record's last step)."""
    step_waiting: np.ndarray
    """int32 requests waiting when the step was formed."""
    step_preempted: np.ndarray
    """int32 requests preempted while forming the step."""
    kv_blocks_total: int
    """GPU KV blocks the policy manages (0 when it does not page)."""
    seed: int = 0
    stats: dict = field(default_factory=dict)
    """The policy's counters (``LLMPolicy.stats()``): preemptions, prefix-cache lookups, ..."""
    meta: dict = field(default_factory=dict)


@dataclass(eq=False)
class TokenTimes:
    """What both LLM drivers derive from their step log, per request (-1: never)."""

    first_seen: np.ndarray
    """Index of the first step record the request took part in."""
    last_seen: np.ndarray
    """Index of the last one."""
    scheduled_ns: np.ndarray
    first_token_ns: np.ndarray
    last_token_ns: np.ndarray
    last_emit_rec: np.ndarray
    """Index of the record in which it emitted its last token."""
    tokens_out: np.ndarray
    gaps_ns: np.ndarray
    """Inter-token gaps into the first step of each record, pooled (later steps of a
    repeated record add their own durations; the driver knows those)."""
    gap_rows: np.ndarray
    """The request of each entry of ``gaps_ns`` (to leave warm-up requests out)."""


def token_times(n: int, rows: np.ndarray, rec: np.ndarray, emits: np.ndarray, start: np.ndarray,
                first_end: np.ndarray, end: np.ndarray, repeats: np.ndarray,
                emit_tokens: np.ndarray | None = None) -> TokenTimes:
    """Per-request token times from a step log: ``rows``/``emits`` of every record
    concatenated in record order, ``rec`` the record of each entry; per record its ``start``, the end of
    its first step (``first_end``), its ``end`` and how many identical steps it stands for.
    ``emit_tokens`` (speculative decoding): tokens each entry emits, None: one per emitting
    entry. Tokens a step emits together arrive together: one inter-token gap per step that
    emits (as vLLM's benchmark counts one per streamed chunk)."""
    # Entries grouped by request, in time order within each: entries come in record order,
    # so a stable sort by request is enough (a radix sort, linear, where request numbers fit
    # 16 bits). Each entry's record and whether it emits move in one gather (the moves
    # through a random order are what costs); where each group starts is a cumulative sum
    # of the entries per request. Few passes over the entries, in 32-bit words where they
    # fit (a busy run logs millions).
    small = n <= 1 << 16
    order = np.argsort(rows.astype(np.uint16, copy=False) if small else rows, kind="stable")
    narrow = not rec.size or int(rec[-1]) < 1 << 30
    packed = np.left_shift(rec, 1, dtype=np.int32 if narrow else np.int64)
    packed |= emits
    packed = packed[order]
    if emit_tokens is None:
        del order   # (a busy run's order is the largest array here)
    seen = np.bincount(rows, minlength=n)
    ends = np.cumsum(seen)
    present = np.flatnonzero(seen)
    starts = ends[present] - seen[present]
    first_seen, last_seen = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    first_seen[present] = packed[starts] >> 1
    last_seen[present] = packed[ends[present] - 1] >> 1
    scheduled_ns = np.append(start, -1)[first_seen]   # index -1: the appended "never"

    # Emitted tokens, grouped by request then time.
    emitted = np.empty(packed.shape[0], bool)
    np.bitwise_and(packed, 1, out=emitted, casting="unsafe")
    erec = packed[emitted]
    erec >>= 1
    per_row = np.zeros(n, np.int64)
    if present.size:
        per_row[present] = np.add.reduceat(emitted, starts, dtype=count_type(emitted))
    eends = np.cumsum(per_row)
    has = np.flatnonzero(per_row)
    firsts, lasts = eends[has] - per_row[has], eends[has] - 1
    tokens_out = np.zeros(n, np.int64)
    weights = None
    if has.size:
        weights = repeats[erec] if emit_tokens is None else repeats[erec] * emit_tokens[order[emitted]]
        tokens_out[has] = np.add.reduceat(weights, firsts, dtype=np.int64)
    del packed, emitted, weights
    first_token_ns = np.full(n, -1, np.int64)
    first_token_ns[has] = first_end[erec[firsts]]
    last_token_ns = np.full(n, -1, np.int64)
    last_token_ns[has] = end[erec[lasts]]
    last_emit_rec = np.full(n, -1, np.int64)
    last_emit_rec[has] = erec[lasts]
    # A gap into each emitting entry but a request's first, from the entry before it: the
    # request of each is its request's number repeated once per emitting entry less one.
    later = np.ones(erec.size, bool)
    later[firsts] = False
    later = later[1:]
    gaps_ns = first_end[erec[1:]]
    gaps_ns -= end[erec[:-1]]
    gaps_ns = gaps_ns[later]
    gap_rows = np.repeat(np.arange(n, dtype=np.int32 if n < 1 << 31 else np.int64), np.maximum(per_row - 1, 0))
    return TokenTimes(first_seen, last_seen, scheduled_ns, first_token_ns, last_token_ns, last_emit_rec,
                      tokens_out, gaps_ns, gap_rows)


def count_type(flags: np.ndarray):
    """A type for counts of ``flags`` (bool) to be summed in without overflow: 32 bits where
    they fit (reduceat in another type than its input's casts the whole input first)."""
    return np.int32 if flags.shape[0] < 1 << 31 else np.int64


def apply_reject(policy, status: np.ndarray, end_ns: np.ndarray, delivered: int, now: int, reject) -> None:
    """Mark ``reject.rows`` rejected at ``now``, after checking the policy only rejects waiting rows."""
    from schedsim.core.results import QUEUED, REJECT_STATUS, PolicyError

    rows = np.asarray(reject.rows, dtype=np.int64)
    if rows.size and (rows.max() >= delivered or (status[rows] != QUEUED).any()):
        raise PolicyError(f"{type(policy).__name__} rejected rows that are not waiting")
    status[rows] = REJECT_STATUS.get(reject.reason, REJECT_STATUS["queue_full"])
    end_ns[rows] = now


def step_token_sums(tokens: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, prefill tokens) of each step record, from its rows' tokens concatenated."""
    if not sizes.size:
        return tokens, tokens
    starts = np.cumsum(sizes) - sizes
    # Summed in a 32-bit type where no sum can overflow it: reduceat in another type than
    # the column's (numpy's default for small integers is 64 bits) first casts the whole
    # column, millions of entries in a busy run.
    prefill = tokens.copy()
    prefill[prefill <= 1] = 0
    if tokens.dtype.kind == "i" and tokens.dtype.itemsize <= 4 and int(np.add.reduce(tokens, dtype=np.int64)) < 1 << 31:
        return (np.add.reduceat(tokens, starts, dtype=np.int32).astype(np.int64),
                np.add.reduceat(prefill, starts, dtype=np.int32).astype(np.int64))
    return (np.add.reduceat(tokens, starts, dtype=np.int64),
            np.add.reduceat(prefill, starts, dtype=np.int64))
