"""requests.csv's rows made in C (schedsim.run._csv_rows) are the bytes the numpy rows make
(csv_text, itself checked against pyarrow's writer): on random tables with nulls, repeated
batch fields and values at the edges of what csv_text writes; where csv_text leaves a chunk to
pyarrow, so does the C."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedsim.core.results import STATUS_NAMES
from schedsim.run import report
from schedsim.run.csv_text import Unsupported

if report._c_request_rows is None:
    if os.environ.get("SCHEDSIM_REQUIRE_SPEEDUPS") == "1":
        raise RuntimeError("schedsim.run._csv_rows is not built (setup.py), and SCHEDSIM_REQUIRE_SPEEDUPS=1")
    pytest.skip("the C extension is not built here", allow_module_level=True)

PROPS = settings(max_examples=300, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
EDGE_NS = [0, 1, 999, 1000, 1001, 10**9 - 1, 10**9, 10**9 + 1, 123_456_789_000, 10**15 - 1, 10**15, 10**15 + 1,
           999_999 * 10**9 + 999_999_999, 10**6 * 10**9]


def result(arrival, start, end, size, instance, status):
    """What request_rows reads of a SimResult."""
    return SimpleNamespace(requests=SimpleNamespace(arrival_ns=np.asarray(arrival, np.int64)),
                           start_ns=np.asarray(start, np.int64), end_ns=np.asarray(end, np.int64),
                           batch_size=np.asarray(size, np.int32), instance=np.asarray(instance, np.int16),
                           status=np.asarray(status, np.int8))


def numpy_or_unsupported(res, request_id, a, b):
    try:
        return bytes(report.request_rows_numpy(res, request_id, a, b))
    except Unsupported:
        return Unsupported


def c_or_unsupported(res, request_id, a, b):
    try:
        return bytes(report.request_rows(res, request_id, a, b))
    except Unsupported:
        return Unsupported


@st.composite
def tables(draw):
    n = draw(st.integers(1, 60))
    times = st.one_of(st.integers(0, 5 * 10**9), st.sampled_from(EDGE_NS))
    arrival = draw(st.lists(times, min_size=n, max_size=n))
    # Batches: runs of rows sharing start, end, size, instance and status.
    start, end, size, instance, status = [], [], [], [], []
    while len(start) < n:
        run = draw(st.integers(1, 8))
        s = draw(st.one_of(st.just(-1), times))
        e = draw(st.one_of(st.just(-1), times, st.integers(0, 10**6).map(lambda d, s=s: max(s, 0) + d)))
        b = draw(st.one_of(st.integers(0, 200), st.sampled_from([10**15 - 1, 10**15])))
        i = draw(st.integers(0, 3))
        code = draw(st.integers(0, len(STATUS_NAMES) - 1))
        for column, value in zip((start, end, size, instance, status), (s, e, b, i, code)):
            column.extend([value] * run)
    start, end, size, instance, status = (c[:n] for c in (start, end, size, instance, status))
    # Most rows as a run makes them: started after arriving, ended after starting.
    if draw(st.booleans()):
        start = [max(s, a) if s >= 0 else s for s, a in zip(start, arrival)]
        end = [max(e, s) if e >= 0 and s >= 0 else e for e, s in zip(end, start)]
    request_id = draw(st.one_of(st.just(np.arange(n)), st.lists(st.sampled_from([0, 7, 10**14, 10**15 - 1, 10**15]),
                                                                min_size=n, max_size=n).map(np.array)))
    size = [min(b, 2**31 - 1) for b in size]
    return result(arrival, start, end, size, instance, status), np.asarray(request_id, np.int64)


@PROPS
@given(tables(), st.data())
def test_the_c_rows_are_the_numpy_rows(table, data):
    res, request_id = table
    n = len(request_id)
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(a, n))
    assert c_or_unsupported(res, request_id, a, b) == numpy_or_unsupported(res, request_id, a, b)


def test_a_written_file_is_the_same_with_and_without_the_c_rows(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    n = 50_000
    arrival = np.cumsum(rng.integers(0, 200_000, n))
    start = arrival + rng.integers(0, 2_000_000, n)
    start[rng.random(n) < 0.01] = -1
    end = np.where(start >= 0, start + rng.integers(1, 3_000_000, n), -1)
    res = result(arrival, start, end, rng.integers(1, 64, n), rng.integers(0, 2, n), np.full(n, 2))
    monkeypatch.setattr(report, "_TEXT_CHUNK_ROWS", 4096)
    request_id = np.arange(n)
    for c_rows, threads in ((report._c_request_rows, 2), (None, 1)):
        monkeypatch.setattr(report, "_c_request_rows", c_rows)
        parts = report.TableParts(n, lambda a, b: report.request_table(res, request_id, a, b),
                                  lambda a, b: report.request_rows(res, request_id, a, b), text_threads=threads)
        report.write_csv(parts, tmp_path / f"{threads}.csv")
    assert (tmp_path / "1.csv").read_bytes() == (tmp_path / "2.csv").read_bytes()


@pytest.mark.parametrize("request_id, size", [(10**15 - 1, 3), (10**15, 3), (5, 10**9), (0, 0)])
@pytest.mark.parametrize("arrival, start, end", [(10**9, 2 * 10**9, 3 * 10**9), (999, 1000, 10**6), (1000, -1, -1),
                                                 (10**15 - 1, 10**15 - 1, 10**15)])
def test_edges_of_what_csv_text_writes(request_id, size, arrival, start, end):
    res = result([arrival, arrival], [start, start], [end, end], [size, size], [0, 1], [2, 3])
    ids = np.array([request_id, 1])
    assert c_or_unsupported(res, ids, 0, 2) == numpy_or_unsupported(res, ids, 0, 2)
