"""Writing a run's per-request table: the CSV by chunks of rows is pyarrow's CSV byte for byte,
nulls included; Parquet holds the same values; no pandas on the way."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from policies import DynamicBatcher
from schedsim.core.policy import Requests
from schedsim.core.simulate import simulate
from schedsim.cost.model import CostModel
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.run import report
from schedsim.traces.table import Trace


@pytest.fixture(scope="module")
def result():
    """A run with rejections (nulls in start_s, batch_size, ...) and completions."""
    n = 5000
    req = Requests.from_trace(Trace.from_arrivals(np.cumsum(np.full(n, 2e-5)), seq_len=[128] * n))
    cost = CostModel.from_profile(load_profile(default_profile_path()))
    res = simulate(req, DynamicBatcher(max_batch_size=16, max_queue_delay_us=200, max_queue_size=20), cost, seed=2)
    assert (res.start_ns < 0).any() and (res.start_ns >= 0).any()
    return res


def test_chunked_csv_is_pyarrows_csv(result, tmp_path, monkeypatch):
    table = report.request_table(result, np.arange(len(result.requests)))
    pacsv.write_csv(table, tmp_path / "one.csv")
    monkeypatch.setattr(report, "_CHUNK_ROWS", 333)  # 16 chunks, the last one short
    monkeypatch.setattr(report.os, "cpu_count", lambda: 3)
    report.write_csv(table, tmp_path / "chunks.csv")
    assert (tmp_path / "chunks.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()
    # write_outputs builds the table a chunk at a time: the same bytes again.
    written = report.write_outputs(tmp_path / "run", result, np.arange(len(result.requests)), {})
    assert written[0].read_bytes() == (tmp_path / "one.csv").read_bytes()
    assert b",," in (tmp_path / "one.csv").read_bytes()  # the nulls were written as empty fields


def test_csv_text_by_chunks_and_pyarrow_where_it_cannot(result, tmp_path, monkeypatch):
    """The text by csv_text, by chunks, is pyarrow's; so is a file where some chunks go to
    pyarrow (a value csv_text does not write)."""
    request_id = np.arange(len(result.requests))
    table = report.request_table(result, request_id)
    pacsv.write_csv(table, tmp_path / "one.csv")
    assert report.request_rows(result, request_id, 0, len(request_id))  # csv_text writes all of it
    monkeypatch.setattr(report, "_TEXT_CHUNK_ROWS", 333)
    monkeypatch.setattr(report.os, "cpu_count", lambda: 3)
    written = report.write_outputs(tmp_path / "run", result, request_id, {})
    assert written[0].read_bytes() == (tmp_path / "one.csv").read_bytes()

    def text(start, stop):
        if start % 666 == 0:
            raise report.Unsupported("by pyarrow")
        return report.request_rows(result, request_id, start, stop)

    parts = report.TableParts(len(request_id), lambda a, b: report.request_table(result, request_id, a, b), text)
    report.write_csv(parts, tmp_path / "mixed.csv")
    assert (tmp_path / "mixed.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()
    report.write_csv(report.TableParts(0, parts.slice, text), tmp_path / "empty.csv")
    pacsv.write_csv(table.slice(0, 0), tmp_path / "empty_pyarrow.csv")
    assert (tmp_path / "empty.csv").read_bytes() == (tmp_path / "empty_pyarrow.csv").read_bytes()


def test_parquet_holds_the_csv_values(result, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_CHUNK_ROWS", 999)  # several row groups
    summary = {"completed": 1}
    csv_paths = report.write_outputs(tmp_path / "csv", result, np.arange(len(result.requests)), summary)
    pq_paths = report.write_outputs(tmp_path / "pq", result, np.arange(len(result.requests)), summary, fmt="parquet")
    assert [p.name for p in csv_paths] == ["requests.csv", "summary.json"]
    assert [p.name for p in pq_paths] == ["requests.parquet", "summary.json"]
    a, b = pacsv.read_csv(csv_paths[0]), pq.read_table(pq_paths[0])
    assert a.column_names == b.column_names
    for name in a.column_names:
        assert a.column(name).to_pylist() == b.column(name).to_pylist(), name


def test_writing_the_table_does_not_import_pandas(result):
    code = ("import sys, numpy as np\n"
            "from schedsim.run.report import arrow, request_table, strings\n"
            "strings(['a', 'bc']); arrow(np.arange(3), np.array([True, False, True]))\n"
            "assert 'pandas' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
