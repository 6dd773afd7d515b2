"""csv_text makes the bytes pyarrow's CSV writer gives for integers, decimals k / 10**d and
labels, nulls included, or says it cannot (Unsupported); never other bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedsim.run.csv_text import END, Rows, Unsupported

NAMES = ("unfinished", "running", "completed", "rejected_queue_full")


def pyarrow_csv(columns: dict) -> bytes:
    sink = pa.BufferOutputStream()
    pacsv.write_csv(pa.table(columns), sink)
    return sink.getvalue().to_pybytes()


def ours(names, build, n) -> bytes:
    """The file csv_text's rows make, after the header pyarrow writes (without its newline)."""
    rows = Rows(n)
    build(rows)
    return b",".join(b'"' + name.encode() + b'"' for name in names) + bytes(rows.text()) + END


def integer_columns(values, valid):
    return pa.array([int(v) if ok else None for v, ok in zip(values, valid)], pa.int64())


def decimal_columns(values, digits, valid):
    return pa.array([int(v) / 10**digits if ok else None for v, ok in zip(values, valid)], pa.float64())


# Values by magnitude, with the edges of each unit of digits and of the exact range.
edges = [0, 1, 9, 10, 999, 1000, 1001, 9999, 10**4, 10**6, 10**7 - 1, 10**7, 10**9, 10**11 + 1]


def magnitudes(top):
    return st.one_of(st.sampled_from([e for e in edges if e < top]), st.integers(0, top - 1),
                     st.integers(0, 9).map(lambda d: 10 ** min(d, len(str(top)) - 1) % top))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 40), digits=st.sampled_from([3, 6, 9]))
def test_decimals_are_pyarrows_text(data, n, digits):
    top = 10 ** (digits + 6)  # integer parts below 10**6
    k = np.array(data.draw(st.lists(magnitudes(top), min_size=n, max_size=n)), np.int64)
    valid = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    ints = np.array(data.draw(st.lists(magnitudes(10**15), min_size=n, max_size=n)), np.int64)
    codes = np.array(data.draw(st.lists(st.integers(0, len(NAMES) - 1), min_size=n, max_size=n)))
    expected = pyarrow_csv({"id": integer_columns(ints, np.ones(n, bool)), "t": decimal_columns(k, digits, valid),
                            "u": decimal_columns(k, digits, np.ones(n, bool)), "i": integer_columns(ints, valid),
                            "status": pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(NAMES))})

    def build(rows):
        rows.integer(ints)
        rows.decimal(k, digits, valid)
        rows.decimal(k, digits)
        rows.integer(ints, valid)
        rows.labels(codes, NAMES)

    tiny = 10 ** (digits - 6)
    if digits > 6 and ((k > 0) & (k < tiny)).any():  # pyarrow writes an exponent there
        with pytest.raises(Unsupported):
            ours(["id", "t", "u", "i", "status"], build, n)
        return
    assert ours(["id", "t", "u", "i", "status"], build, n) == expected


@pytest.mark.parametrize("column", [
    lambda r: r.integer(np.array([3, -1])),
    lambda r: r.integer(np.array([10**15])),
    lambda r: r.decimal(np.array([5, -1]), 6),
    lambda r: r.decimal(np.array([10**15]), 9),     # 10**6 s: past the exact range
    lambda r: r.decimal(np.array([0, 999]), 9),     # 999 ns: pyarrow writes 9.99e-7
    lambda r: r.labels(np.array([0, 7]), NAMES),
])
def test_values_it_cannot_write_raise_unsupported(column):
    with pytest.raises(Unsupported):
        column(Rows(2))


def test_a_null_far_outside_the_range_is_still_empty():
    rows = Rows(2)
    rows.decimal(np.array([-5, 1_000_000]), 9, np.array([False, True]))
    assert bytes(rows.text()) == b"\n\n0.001"


def test_edges_of_pyarrows_notation():
    # 1e-6 s and more: fixed notation; the largest exact values; whole numbers without a point.
    k = np.array([0, 1, 1000, 10**9, 999_999_999_999, 123_000_000_000], np.int64)
    expected = pyarrow_csv({"ms": decimal_columns(k, 6, np.ones(len(k), bool))})
    assert ours(["ms"], lambda r: r.decimal(k, 6), len(k)) == expected
    k = np.array([0, 1000, 10**9, 999_999_999_999_999, 123_000_000_000], np.int64)
    expected = pyarrow_csv({"s": decimal_columns(k, 9, np.ones(len(k), bool))})
    assert ours(["s"], lambda r: r.decimal(k, 9), len(k)) == expected


def test_a_repeated_block_is_the_columns_added_row_by_row():
    k = np.array([5_000_000, 7, 0, 123_456_789_012], np.int64)
    valid = np.array([True, False, True, True])
    index = np.array([0, 0, 3, 1, 1, 2, 3])
    block = Rows(len(k), first=False)
    block.decimal(k, 9, valid)
    block.labels(np.array([2, 0, 1, 3]), NAMES)
    repeated = Rows(len(index))
    repeated.integer(index)
    repeated.repeat(block, index)
    direct = Rows(len(index))
    direct.integer(index)
    direct.decimal(k[index], 9, valid[index])
    direct.labels(np.array([2, 0, 1, 3])[index], NAMES)
    assert bytes(repeated.text()) == bytes(direct.text())
