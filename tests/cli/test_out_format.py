"""``schedsim run --format``: requests.csv by default, requests.parquet on request, one-line errors."""

from __future__ import annotations

import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from cli_helpers import ROOT, TRACE, assert_one_line_error, schedsim


def test_parquet_holds_what_the_csv_holds(tmp_path):
    for fmt in ("csv", "parquet"):
        proc = schedsim("run", TRACE, "--out", tmp_path / fmt, "--format", fmt)
        assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "parquet").iterdir()) == ["requests.parquet", "summary.json"]
    a, b = pacsv.read_csv(tmp_path / "csv" / "requests.csv"), pq.read_table(tmp_path / "parquet" / "requests.parquet")
    assert a.column_names == b.column_names and a.num_rows == b.num_rows > 0
    for name in a.column_names:
        assert a.column(name).to_pylist() == b.column(name).to_pylist(), name


def test_parquet_is_refused_for_an_llm_run(tmp_path):
    proc = schedsim("run", ROOT / "docs" / "examples" / "azure_sample.csv", "--policy", "paged-kv",
                    "--profile", ROOT / "tests" / "data" / "llm_steps_synthetic.csv", "--max-model-len", "8192",
                    "--out", tmp_path / "o", "--format", "parquet")
    assert_one_line_error(proc, "--format", "LLM runs write CSV")


def test_an_unknown_format_is_one_line(tmp_path):
    assert_one_line_error(schedsim("run", TRACE, "--out", tmp_path / "o", "--format", "xml"), "--format", "'xml'")
    assert not (tmp_path / "o").exists()
