"""Per-request token times and per-record sums from a step log equal a plain-Python
reading of the same log, whatever integer types the log's columns come in (the simulator
keeps request rows in 16 bits and records in 32 where they fit)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from schedsim.core.llm_results import step_token_sums, token_times


def reference(n, rows, rec, emits, start, first_end, end, repeats, emit_tokens=None):
    first_seen, last_seen = [-1] * n, [-1] * n
    first_token, last_token, last_emit, tokens_out = [-1] * n, [-1] * n, [-1] * n, [0] * n
    per_request_gaps: list[list[int]] = [[] for _ in range(n)]
    for i, (r, k, e) in enumerate(zip(rows, rec, emits)):
        if first_seen[r] < 0:
            first_seen[r] = k
        last_seen[r] = k
        if not e:
            continue
        tokens_out[r] += repeats[k] * (1 if emit_tokens is None else emit_tokens[i])
        if last_emit[r] < 0:
            first_token[r] = first_end[k]
        else:
            per_request_gaps[r].append(first_end[k] - end[last_emit[r]])
        last_emit[r], last_token[r] = k, end[k]
    gaps = [g for r in range(n) for g in per_request_gaps[r]]
    gap_rows = [r for r in range(n) for _ in per_request_gaps[r]]
    scheduled = [start[k] if k >= 0 else -1 for k in first_seen]
    return dict(first_seen=first_seen, last_seen=last_seen, scheduled_ns=scheduled,
                first_token_ns=first_token, last_token_ns=last_token, last_emit_rec=last_emit,
                tokens_out=tokens_out, gaps_ns=gaps, gap_rows=gap_rows)


@st.composite
def step_logs(draw):
    n = draw(st.integers(1, 12))
    records = draw(st.lists(st.lists(st.tuples(st.integers(0, n - 1), st.booleans(), st.integers(1, 600)),
                                     min_size=1, max_size=6, unique_by=lambda e: e[0]),
                            min_size=0, max_size=25))
    rows = [r for entries in records for r, _, _ in entries]
    emits = [e for entries in records for _, e, _ in entries]
    tokens = [t for entries in records for _, _, t in entries]
    rec = [k for k, entries in enumerate(records) for _ in entries]
    starts, t = [], 0
    first_end, end, repeats = [], [], []
    for _ in records:
        t += draw(st.integers(0, 50))
        k = draw(st.integers(1, 4))
        step = draw(st.integers(1, 30))
        starts.append(t)
        first_end.append(t + step)
        end.append(t + k * step)
        repeats.append(k)
        t += k * step
    spec = draw(st.booleans())
    emit_tokens = [draw(st.integers(0, 4)) if e else 0 for e in emits] if spec else None
    return n, rows, rec, emits, tokens, [len(e) for e in records], starts, first_end, end, repeats, emit_tokens


@settings(max_examples=300, deadline=None)
@given(log=step_logs(), narrow=st.booleans())
def test_token_times_equal_a_plain_reading(log, narrow):
    n, rows, rec, emits, _, _, start, first_end, end, repeats, emit_tokens = log
    want = reference(n, rows, rec, emits, start, first_end, end, repeats, emit_tokens)
    got = token_times(n, np.array(rows, np.uint16 if narrow else np.int64),
                      np.array(rec, np.int32 if narrow else np.int64), np.array(emits, bool),
                      np.array(start, np.int64), np.array(first_end, np.int64), np.array(end, np.int64),
                      np.array(repeats, np.int64),
                      None if emit_tokens is None else np.array(emit_tokens, np.int64))
    for name, values in want.items():
        assert getattr(got, name).tolist() == values, name


@settings(max_examples=200, deadline=None)
@given(log=step_logs(), dtype=st.sampled_from([np.int32, np.int64]))
def test_step_token_sums_equal_a_plain_reading(log, dtype):
    tokens, sizes = log[4], log[5]
    tok, pre = step_token_sums(np.array(tokens, dtype), np.array(sizes, np.int64))
    at = np.cumsum([0] + sizes)
    assert not sizes or tok.dtype == pre.dtype == np.int64
    assert tok.tolist() == [sum(tokens[a:b]) for a, b in zip(at, at[1:])]
    assert pre.tolist() == [sum(t for t in tokens[a:b] if t > 1) for a, b in zip(at, at[1:])]


def test_step_token_sums_too_large_for_32_bits():
    tokens = np.full(3, 1 << 30, np.int32)
    tok, pre = step_token_sums(tokens, np.array([3], np.int64))
    assert tok.tolist() == pre.tolist() == [3 << 30]
