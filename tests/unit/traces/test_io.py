"""Trace loading, saving, importers and the ``trace info/download`` commands."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from schedsim.cli.trace import app
from schedsim.errors import InputError
from schedsim.traces.table import Trace
from schedsim.traces.io import (PUBLIC_TRACES, fetch_public_trace, head, load_trace, save_trace,
                               scale_rate, sha256_file, time_window, trace_stats)

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "traces"


def write(tmp_path, text, name="trace.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def error_of(path) -> str:
    with pytest.raises(InputError) as e:
        load_trace(path)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ----------------------------------------------------------------- schedsim CSV/Parquet

def test_minimal_csv_defaults(tmp_path):
    t = load_trace(write(tmp_path, "arrival_s\n0\n0.5\n0.5\n2\n"))
    assert t.arrival_s.tolist() == [0, 0.5, 0.5, 2]
    assert t.arrival_s.dtype == np.float64
    assert t.request_id.tolist() == [0, 1, 2, 3]
    assert t.batch.dtype == np.int32 and t.batch.tolist() == [1] * 4
    assert t.priority.dtype == np.int16 and t.timeout_us.dtype == np.int64
    assert not t.seq_len.any() and t.hash_ids is None


def test_all_columns_and_ignored_extras(tmp_path):
    p = write(tmp_path, "note,arrival_s,request_id,batch,seq_len,input_tokens,output_tokens,priority,timeout_us\n"
                        "x,0.25,10,2,128,100,7,1,5000\n"
                        "y,1.5,3,1,64,0,0,0,0\n")
    t = load_trace(p)
    assert t.request_id.tolist() == [10, 3]
    assert t.batch.tolist() == [2, 1] and t.seq_len.tolist() == [128, 64]
    assert t.input_tokens.tolist() == [100, 0] and t.output_tokens.tolist() == [7, 0]
    assert t.priority.tolist() == [1, 0] and t.timeout_us.tolist() == [5000, 0]
    assert t.meta["ignored_columns"] == ["note"]
    assert t.source == str(p)


def test_blank_lines_skipped_but_counted(tmp_path):
    p = write(tmp_path, "arrival_s,batch\n0,1\n\n1,1\n2,0\n")
    assert error_of(p) == f"{p}:5: batch: 0 is below 1; a request carries at least one sample"


def random_traces():
    n = st.integers(1, 40)

    @st.composite
    def build(draw):
        k = draw(n)
        gaps = draw(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=k, max_size=k))
        arrival = np.cumsum(gaps)
        ints = lambda lo, hi: np.array(draw(st.lists(st.integers(lo, hi), min_size=k, max_size=k)))  # noqa: E731
        cols = {}
        for c, lo, hi in (("batch", 1, 64), ("seq_len", 0, 4096), ("input_tokens", 0, 10**6),
                          ("output_tokens", 0, 10**5), ("priority", 0, 7), ("timeout_us", 0, 10**12)):
            if draw(st.booleans()):
                cols[c] = ints(lo, hi)
        if draw(st.booleans()):
            cols["request_id"] = np.array(draw(st.lists(st.integers(-2**62, 2**62), min_size=k,
                                                        max_size=k, unique=True)))
        t = Trace.from_arrivals(arrival, **cols)
        if draw(st.booleans()):
            lengths = np.array(draw(st.lists(st.integers(0, 5), min_size=k, max_size=k)))
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            ids = np.array(draw(st.lists(st.integers(0, 2**40), min_size=int(offsets[-1]),
                                         max_size=int(offsets[-1]))), dtype=np.int64)
            t = dataclasses.replace(t, hash_offsets=offsets, hash_ids=ids)
        return t

    return build()


def assert_same(a: Trace, b: Trace):
    for f in ("arrival_s", "request_id", "batch", "seq_len", "input_tokens", "output_tokens",
              "priority", "timeout_us", "hash_offsets", "hash_ids"):
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            assert x is None and y is None, f
            continue
        assert x.dtype == y.dtype, f
        np.testing.assert_array_equal(x, y, err_msg=f)


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".pq"])
@settings(max_examples=40, deadline=None)
@given(trace=random_traces())
def test_round_trip(tmp_path_factory, suffix, trace):
    p = tmp_path_factory.mktemp("rt") / f"t{suffix}"
    save_trace(trace, p)
    assert_same(trace, load_trace(p))


def test_save_writes_only_non_default_columns(tmp_path):
    p = tmp_path / "t.csv"
    save_trace(Trace.from_arrivals([0.0, 1.0], output_tokens=[0, 3]), p)
    assert p.read_text().splitlines()[0] == "arrival_s,output_tokens"
    save_trace(Trace.from_arrivals([0.0, 1.0]), p)
    assert p.read_text().splitlines() == ["arrival_s", "0", "1"]


def test_save_is_atomic(tmp_path, monkeypatch):
    p = tmp_path / "t.csv"
    save_trace(Trace.from_arrivals([0.0, 1.0]), p)
    before = p.read_text()
    import pyarrow.csv as pcsv

    def broken(table, where, **kw):
        Path(where).write_text("arrival_s\n0.0\n")  # half-written
        raise OSError("disk full")

    monkeypatch.setattr(pcsv, "write_csv", broken)
    with pytest.raises(OSError):
        save_trace(Trace.from_arrivals([5.0, 6.0, 7.0]), p)
    assert p.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["t.csv"]


def test_save_bad_destination(tmp_path):
    with pytest.raises(InputError, match="unknown trace extension"):
        save_trace(Trace.from_arrivals([0.0]), tmp_path / "t.txt")
    with pytest.raises(InputError, match="does not exist"):
        save_trace(Trace.from_arrivals([0.0]), tmp_path / "nope" / "t.csv")


def test_parquet_keeps_meta(tmp_path):
    t = Trace.from_arrivals([0.0, 1.0], meta={"generator": "poisson", "seed": 3})
    save_trace(t, tmp_path / "t.parquet")
    assert load_trace(tmp_path / "t.parquet").meta["saved_meta"] == {"generator": "poisson", "seed": 3}


def test_two_million_rows_load_exactly(tmp_path):
    # How fast is benchmarks/' business (ratios within one run), not a timed test's.
    arrival = np.cumsum(np.random.default_rng(0).exponential(1e-3, 2_000_000))
    p = tmp_path / "big.csv"
    save_trace(Trace.from_arrivals(arrival), p)
    np.testing.assert_array_equal(load_trace(p).arrival_s, arrival)


# ------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("text, expected", [
    ("arrival_s,batch\n0,1\n1,1\n1.5,2\n2,1\n3,1\nabc,1\n", "7: arrival_s: 'abc' is not a number"),
    ("arrival_s,batch\n0,1\n1,x2\n", "3: batch: 'x2' is not a number"),
    ("arrival_s,batch\n0,1\n1,1\n2,1\n2,1\n2,1\n2,1\n2.0,1\n1.5,1\n",
     "9: arrival_s: 1.5 is earlier than the previous row's 2.0; arrivals must be non-decreasing"),
    ("arrival_s\n0\n\n", None),  # trailing blank line is fine
    ("arrival_s,batch\n0,1\n,1\n", "3: arrival_s: is empty or NaN"),
    ("arrival_s,batch\n0,1\nnan,1\n", "3: arrival_s: is empty or NaN"),
    ("arrival_s,batch\n0,1\n1,\n", "3: batch: is empty or NaN"),
    ("arrival_s\n0\ninf\n", "3: arrival_s: inf is not finite"),
    ("arrival_s\n-1\n", "2: arrival_s: -1.0 is negative"),
    ("arrival_s,seq_len\n0,-3\n", "2: seq_len: -3 is below 0; must be >= 0"),
    ("arrival_s,batch\n0,2.5\n", "2: batch: 2.5 is not a whole number"),
    ("arrival_s,batch\n0,0\n", "2: batch: 0 is below 1; a request carries at least one sample"),
    ("arrival_s,priority\n0,40000\n", "2: priority: 40000 is out of range (at most 32767)"),
    ("arrival_s,input_tokens\n0,1\n1,3000000000\n", "3: input_tokens: 3000000000 is out of range"),
    ("arrival_s,request_id\n0,4\n1,5\n2,4\n", "4: request_id: 4 is already used at"),
    ("arrival_s,request_id\n0,4\n1,\n", "3: request_id: is empty or NaN"),
    ("arrival_s,request_id\n0,4\n1,5.5\n", "3: request_id: 5.5 is not a whole number"),
    ("arrival_s,batch\n0,1\n1,1,7\n", "3: expected 2 fields as in the header, found 3"),
    ("arrival_s,batch\n0,1\n1\n", "3: expected 2 fields as in the header, found 1"),
    ("time,batch\n0,1\n", "1: no arrival_s column (columns found: time, batch)"),
    ("arrival_s,arrival_s\n0,1\n", "1: column 'arrival_s' appears more than once"),
    ("arrival_s\n", "no requests"),
    ("arrival_s,hash_ids\n0,1 2\n1,3 x\n", "3: hash_ids: 'x' is not an integer"),
])
def test_bad_csv(tmp_path, text, expected):
    p = write(tmp_path, text)
    if expected is None:
        assert len(load_trace(p)) == 1
        return
    msg = error_of(p)
    assert msg.startswith(str(p)), msg
    assert expected in msg, msg


def test_request_id_duplicate_names_both_lines(tmp_path):
    p = write(tmp_path, "arrival_s,request_id\n0,4\n1,5\n2,4\n")
    assert error_of(p) == f"{p}:4: request_id: 4 is already used at {p}:2; request ids must be unique"


def test_missing_empty_and_unreadable_files(tmp_path):
    assert error_of(tmp_path / "nope.csv") == f"{tmp_path / 'nope.csv'}: no such file"
    assert "file is empty" in error_of(write(tmp_path, "", "empty.csv"))
    assert "is a directory" in error_of(tmp_path)
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"arrival_s\n\xff\xfe\x00\x01\n")
    assert str(binary) in error_of(binary)
    bad_pq = write(tmp_path, "arrival_s\n0\n", "x.parquet")
    assert "not a readable Parquet file" in error_of(bad_pq)


def test_bad_parquet_values(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0, 2.0, 1.0]}), p)
    assert error_of(p) == (f"{p}: row 3: arrival_s: 1.0 is earlier than the previous row's 2.0; "
                           "arrivals must be non-decreasing")
    pq.write_table(pa.table({"arrival_s": [0.0, 1.0], "batch": ["a", "b"]}), p)
    assert error_of(p) == f"{p}: batch: column has type string, expected numbers"
    pq.write_table(pa.table({"t": [0.0]}), p)
    assert "no arrival_s column" in error_of(p)


def test_bad_mooncake(tmp_path):
    p = write(tmp_path, '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                        '{"timestamp": 3000, "input_length": 5, "output_length": 1\n', "m.jsonl")
    assert error_of(p).startswith(f"{p}:2: not valid JSON")
    p = write(tmp_path, '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                        '{"timestamp": 3000, "input_length": -5, "output_length": 1}\n', "m.jsonl")
    assert error_of(p) == f"{p}:2: input_length: -5 is below 0; must be >= 0"
    p = write(tmp_path, '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                        '{"input_length": 5, "output_length": 1}\n', "m.jsonl")
    assert error_of(p) == f"{p}:2: timestamp: is missing or null"
    p = write(tmp_path, '{"timestamp": 0, "input_length": "many", "output_length": 1}\n', "m.jsonl")
    assert error_of(p) == f"{p}:1: input_length: 'many' is not a number"


def test_bad_azure(tmp_path):
    p = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                        "2023-11-16 18:17:03.9799600,10,2\n2023-11-16 18:17:xx,10,2\n")
    assert error_of(p).startswith(f"{p}:3: TIMESTAMP: '2023-11-16 18:17:xx' is not a time")
    p = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                        "2023-11-16 18:17:03.9799600,10,2\n2023-11-16 18:17:04.1,10,-2\n")
    assert error_of(p) == f"{p}:3: GeneratedTokens: -2 is below 0; must be >= 0"


# ------------------------------------------------------------------------- importers

def test_azure_timestamps_exact(tmp_path):
    p = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                        "2023-11-16 23:59:59.9999999,100,5\n"
                        "2023-11-17 00:00:00.0000001,200,6\n"
                        "2023-11-17 00:00:01,300,7")
    t = load_trace(p)
    assert t.meta["format"] == "azure-llm-2023"
    assert t.arrival_s.tolist() == [0.0, 2e-7, 1.0000001]
    assert t.input_tokens.tolist() == [100, 200, 300] and t.seq_len.tolist() == [100, 200, 300]
    assert t.output_tokens.tolist() == [5, 6, 7]


def test_mooncake_sorts_stably_and_keeps_hashes(tmp_path):
    p = write(tmp_path, '{"timestamp": 6000, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}\n'
                        '{"timestamp": 3000, "input_length": 20, "output_length": 2, "hash_ids": [3]}\n'
                        '{"timestamp": 3000, "input_length": 30, "output_length": 3, "hash_ids": []}\n'
                        '{"timestamp": 9000, "input_length": 40, "output_length": 4, "hash_ids": [1, 5, 6]}\n',
              "m.jsonl")
    t = load_trace(p)
    assert t.arrival_s.tolist() == [0.0, 0.0, 3.0, 6.0]
    assert t.request_id.tolist() == [1, 2, 0, 3]
    assert t.input_tokens.tolist() == [20, 30, 10, 40]
    assert t.hash_offsets.tolist() == [0, 1, 1, 3, 6]
    assert t.hash_ids.tolist() == [3, 1, 2, 1, 5, 6]
    assert "sorted" in t.meta


README_FIGURES = [
    # file, requests, span s, req/s, CV (None: not stated), input mean/median, output mean/median
    ("azure_llm_2023_code.csv", 8819, 3436, 2.57, 13.2, 2048, 1469, 27.9, 13),
    ("azure_llm_2023_conv.csv", 19366, 3502, 5.53, 1.09, 1155, 1020, 211, 129),
    ("mooncake_conversation.jsonl", 12031, 3537, 3.40, None, 12035, 6909, 343, 350),
]


@pytest.mark.parametrize("row", README_FIGURES, ids=lambda r: r[0])
def test_importers_match_readme(row):
    name, n, span, rate, cv, in_mean, in_med, out_mean, out_med = row
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    t = load_trace(path)
    s = trace_stats(t)
    assert s["requests"] == n
    assert round(s["span_s"]) == span
    assert round(s["mean_rate"], 2) == pytest.approx(rate)
    if cv is not None:
        assert s["interarrival_cv"] == pytest.approx(cv, abs=0.05 if cv < 2 else 0.05)
    assert round(s["columns"]["input_tokens"]["mean"]) == in_mean
    assert s["columns"]["input_tokens"]["median"] == in_med
    assert s["columns"]["output_tokens"]["mean"] == pytest.approx(out_mean, abs=0.5)
    assert s["columns"]["output_tokens"]["median"] == out_med
    np.testing.assert_array_equal(t.seq_len, t.input_tokens)
    assert t.arrival_s[0] == 0.0 and np.all(np.diff(t.arrival_s) >= 0)


def test_mooncake_hash_blocks_cover_prompt():
    path = SHARED / "mooncake_conversation.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present")
    t = load_trace(path)
    blocks = np.diff(t.hash_offsets)
    # One hash per 512-token block of the prompt.
    np.testing.assert_array_equal(blocks, -(-t.input_tokens // 512))


def test_azure_code_is_on_off():
    path = SHARED / "azure_llm_2023_code.csv"
    if not path.exists():
        pytest.skip(f"{path} not present")
    gaps = np.diff(load_trace(path).arrival_s)
    assert 1800 < gaps[gaps > 30].sum() < 2200  # README: about 2,000 s in gaps over 30 s


# --------------------------------------------------------------------------- helpers

def test_scale_head_window():
    t = Trace.from_arrivals([0.0, 1.0, 2.0, 4.0], batch=[1, 2, 3, 4])
    fast = scale_rate(t, 2)
    assert fast.arrival_s.tolist() == [0.0, 0.5, 1.0, 2.0]
    assert scale_rate(fast, 2).meta["rate_scale"] == 4.0
    with pytest.raises(InputError):
        scale_rate(t, 0)
    assert head(t, 2).batch.tolist() == [1, 2] and len(head(t, 10)) == 4
    w = time_window(t, 1.0, 4.0)
    assert w.arrival_s.tolist() == [0.0, 1.0] and w.batch.tolist() == [2, 3]
    assert time_window(t, 1.0, rebase=False).arrival_s.tolist() == [1.0, 2.0, 4.0]


# ------------------------------------------------------------------------------- CLI

runner = CliRunner()


def test_cli_info(tmp_path):
    p = tmp_path / "t.csv"
    save_trace(Trace.from_arrivals([0.0, 1.0, 2.0, 4.0], input_tokens=[10, 20, 30, 40]), p)
    r = runner.invoke(app, ["info", str(p)])
    assert r.exit_code == 0, r.output
    for word in ("requests", "span s", "mean req/s", "inter-arrival CV", "input_tokens", "25", "40"):
        assert word in r.output


def test_cli_info_bad_file_raises_input_error(tmp_path):
    r = runner.invoke(app, ["info", str(tmp_path / "nope.csv")])
    assert isinstance(r.exception, InputError)


def test_cli_download_print_only(tmp_path):
    r = runner.invoke(app, ["download", "azure-conv", "--dir", str(tmp_path), "--print-only"])
    assert r.exit_code == 0, r.output
    url, _, sha = PUBLIC_TRACES["azure-conv"]
    assert url in r.output and sha in r.output
    assert url.startswith("https://raw.githubusercontent.com/Azure/AzurePublicDataset/")
    assert list(tmp_path.iterdir()) == []
    r = runner.invoke(app, ["download", "nope", "--print-only"])
    assert isinstance(r.exception, InputError)


def test_download_checksums_match_shared_files():
    for name, (_url, filename, sha) in PUBLIC_TRACES.items():
        path = SHARED / filename
        if not path.exists():
            pytest.skip(f"{path} not present")
        assert sha256_file(path) == sha, name


def test_fetch_verifies_checksum(tmp_path):
    src = tmp_path / "src.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n')
    dest = tmp_path / "dl"
    with pytest.raises(InputError, match="sha256 mismatch"):
        fetch_public_trace("mooncake-conversation", dest, url=src.as_uri())
    assert list(dest.iterdir()) == []  # nothing half-written or unverified left behind
    real = SHARED / "mooncake_conversation.jsonl"
    if real.exists():
        got = fetch_public_trace("mooncake-conversation", dest, url=real.as_uri())
        assert got == dest / "mooncake_conversation.jsonl"
        assert sha256_file(got) == PUBLIC_TRACES["mooncake-conversation"][2]


def test_fetch_network_failure_is_one_line(tmp_path):
    with pytest.raises(InputError) as e:
        fetch_public_trace("azure-code", tmp_path, url=(tmp_path / "missing").as_uri())
    assert "download failed" in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []
