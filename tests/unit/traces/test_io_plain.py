"""A small CSV trace of plain numbers is read without pyarrow (``io._read_plain``): the same
trace, or the same one-line error, as pyarrow's read of the same file."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedsim.errors import InputError
from schedsim.traces import io

INTS = st.one_of(st.integers(-3, 40), st.integers(-2**63, 2**63 - 1), st.sampled_from([2**31, 2**15, 2**63]))
INT_TEXT = st.one_of(INTS.map(str), INTS.map(lambda v: f"00{v}" if v >= 0 else str(v)),
                     st.sampled_from(["", " 5", "5 ", "+5", "1_0", "5.0", "5.5", "1e3", "nan", "0x10", "٣"]))
FLOATS = st.floats(0, 1e4, allow_nan=False, allow_infinity=False)
FLOAT_TEXT = st.one_of(FLOATS.map(repr), FLOATS.map(lambda v: f"{v:.3f}"), FLOATS.map(lambda v: f"{v:e}"),
                       st.integers(0, 99).map(str), st.integers(0, 99).map(lambda v: f"{v}."),
                       st.integers(0, 99).map(lambda v: f".{v}"), st.floats(-1e3, 1e400).map(repr),
                       st.sampled_from(["", "-0", "1e400", "1e-320", "inf", "nan", " 1.5", "1.5e", "1,5", "1_0.5"]))
COLUMNS = ["request_id", "batch", "seq_len", "priority", "timeout_us", "other"]


@st.composite
def plain_traces(draw):
    """CSV text: arrival_s and some other columns, mostly plain numbers, at times not."""
    extra = draw(st.lists(st.sampled_from(COLUMNS), unique=True, max_size=4))
    header = draw(st.permutations(["arrival_s", *extra]))
    n = draw(st.integers(1, 12))
    sorted_times = draw(st.booleans())
    times = sorted(draw(st.lists(FLOATS, min_size=n, max_size=n)))
    rows = []
    for i in range(n):
        row = []
        for c in header:
            if c == "arrival_s":
                row.append(repr(times[i]) if sorted_times and draw(st.integers(0, 9)) else draw(FLOAT_TEXT))
            elif c == "other":
                row.append(draw(st.sampled_from(["x", "", "1"])))
            else:
                row.append(str(i if c == "request_id" else 1) if draw(st.integers(0, 3)) else draw(INT_TEXT))
        rows.append(",".join(row))
    if draw(st.integers(0, 9)) == 0:
        rows.insert(draw(st.integers(0, len(rows))), draw(st.sampled_from(["", "1,2,3,4,5,6,7,8", '"1"'])))
    if draw(st.integers(0, 9)) == 0:  # a control character in a field or between rows
        i = draw(st.integers(0, len(rows) - 1))
        rows[i] += draw(st.sampled_from(["\x0c", "\r", "\t", "\x00", "\x1e", "\r2"]))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    return ",".join(header) + newline + newline.join(rows) + draw(st.sampled_from([newline, "", newline * 2]))


def outcome(path, monkeypatch, plain: bool):
    """The loaded trace's arrays and meta, or the error line."""
    monkeypatch.setattr(io, "_PLAIN_CSV_BYTES", io._PLAIN_CSV_BYTES if plain else -1)
    try:
        trace = io.load_trace(path)
    except InputError as e:
        return str(e)
    arrays = {f: getattr(trace, f) for f in ("arrival_s", "request_id", "batch", "seq_len", "input_tokens",
                                             "output_tokens", "priority", "timeout_us")}
    return ({f: (a.dtype.str, a.tobytes()) for f, a in arrays.items()}, trace.meta)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=plain_traces())
def test_plain_read_is_pyarrows_read(text, tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    path.write_text(text)
    assert outcome(path, monkeypatch, True) == outcome(path, monkeypatch, False)


def test_plain_rows_are_read_without_pyarrow(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,batch,request_id\n0.5,2,7\n\n0.75,1,8\n")
    code = (f"import sys; from schedsim.traces.io import load_trace; t = load_trace({str(path)!r}); "
            "assert 'pyarrow' not in sys.modules, 'pyarrow imported'; print(t.arrival_s.tolist(), t.batch.tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[0.5,", "0.75]", "[2,", "1]"]


@pytest.mark.parametrize("text", [
    'arrival_s\n"0.5"\n',                  # a quote
    "\ufeffarrival_s\n0.5\n",              # a byte-order mark
    "arrival_s,batch\n0.5, 2\n",          # a space
    "arrival_s,batch\n0.5,70000000000\n",  # outside int32
    "arrival_s,hash_ids\n0.5,1 2\n",       # hash_ids
    "arrival_s\n",                         # no rows
    "arrival_s\n0.5\x0c\n",                 # a control character (splitlines() ends a line there)
    "arrival_s\n0.5\r0.7\n",                # a lone carriage return (pyarrow ends a line there)
    "arrival_s,other\n0.5,café\n",          # non-ASCII text
])
def test_anything_else_is_pyarrows(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    header = io._csv_header(path, "t.csv")
    assert io._read_plain(path, header, [c for c in header if c in io.COLUMNS and c != "hash_ids"]) is None


def test_plain_values_and_types(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,priority,request_id\n0,3,-1\n.5,0,9223372036854775807\n")
    cols = io._read_plain(path, ["arrival_s", "priority", "request_id"], ["arrival_s", "priority", "request_id"])
    assert cols["arrival_s"].tolist() == [0.0, 0.5] and cols["arrival_s"].dtype == np.float64
    assert cols["priority"].dtype == np.int16 and cols["request_id"].tolist() == [-1, 2**63 - 1]


def test_int64_column_past_its_range_as_a_float(tmp_path):
    # 2**63 read as a float equals int64's max as a float: it once wrapped to -2**63 in the cast.
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,timeout_us\n0.5,9223372036854775808\n")
    with pytest.raises(InputError, match=r"t.csv:2: timeout_us: 9223372036854775808 is out of range"):
        io.load_trace(path)
