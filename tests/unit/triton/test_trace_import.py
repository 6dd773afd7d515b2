"""Triton trace files into arrival traces: a file recorded from a real CPU server, the shapes
its writer can leave behind (split files, no closing bracket, a cut record, the older
one-record-per-trace layout), and hypothesis for corrupted input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import assert_one_line_error, schedsim
from schedsim.errors import InputError
from schedsim.traces.io import load_trace
from schedsim.triton.trace_import import EXTRA_COLUMNS, read_triton_trace, save_triton_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "triton" / "cpu"
TRACE = DATA / "trace_timestamps.json"
STATS = DATA / "stats_bert_tiny.json"


def _by_id(records) -> dict:
    out: dict = {}
    for r in records:
        for s in r.get("timestamps", []):
            out.setdefault(r["id"], {})[s["name"]] = s["ns"]
    return out


def test_the_recorded_trace_gives_arrivals_and_the_servers_own_times():
    tt = read_triton_trace(TRACE, model="bert_tiny")
    t = tt.trace
    assert len(t) == 14 and tt.warnings == []
    assert t.arrival_s[0] == 0 and np.all(np.diff(t.arrival_s) >= 0)
    stamps = _by_id(json.loads(TRACE.read_text()))
    first = min(stamps[i]["REQUEST_START"] for i in t.request_id.tolist())
    for row, tid in enumerate(t.request_id.tolist()):
        s = stamps[tid]
        assert t.arrival_s[row] == (s["REQUEST_START"] - first) / 1e9
        assert tt.extra["server_queue_us"][row] == (s["COMPUTE_START"] - s["QUEUE_START"]) / 1e3
        assert tt.extra["server_compute_infer_us"][row] == (s["COMPUTE_OUTPUT_START"] - s["COMPUTE_INPUT_END"]) / 1e3
        assert tt.extra["server_latency_us"][row] == (s["REQUEST_END"] - s["REQUEST_START"]) / 1e3
    assert t.meta["model"] == "bert_tiny" and t.meta["model_version"] == ["1"]
    assert (t.batch == 1).all()


def test_executions_match_the_servers_statistics_of_the_same_run():
    tt = read_triton_trace(TRACE, model="bert_tiny")
    stats = json.loads(STATS.read_text())["model_stats"][0]
    execution, size = tt.extra["execution"], tt.extra["execution_requests"]
    assert execution.max() + 1 == stats["execution_count"] == 12
    assert np.array_equal(np.bincount(execution), [3] + [1] * 11)
    assert np.array_equal(size, np.bincount(execution)[execution])
    # Requests of one execution share its compute times.
    for col in ("server_compute_input_us", "server_compute_infer_us", "server_compute_output_us"):
        v = tt.extra[col][execution == 0]
        assert (v == v[0]).all()


def test_several_models_need_a_choice(tmp_path):
    with pytest.raises(InputError, match=r"traces of 2 models \(add_one: 3 requests, bert_tiny: 14 requests\); choose one with --model"):
        read_triton_trace(TRACE)
    with pytest.raises(InputError, match=r"no trace of model 'nope' \(the file has add_one: 3 requests"):
        read_triton_trace(TRACE, model="nope")
    assert len(read_triton_trace(TRACE, model="add_one").trace) == 3


def _write(path: Path, records, close=True) -> Path:
    path.write_text("[" + ",".join(json.dumps(r, separators=(",", ":")) for r in records) + ("]" if close else ""))
    return path


def _same(a, b):
    assert np.array_equal(a.trace.arrival_s, b.trace.arrival_s)
    assert np.array_equal(a.trace.request_id, b.trace.request_id)
    for col in EXTRA_COLUMNS:
        assert np.array_equal(a.extra[col], b.extra[col], equal_nan=True)


def test_files_split_by_log_frequency_read_as_one(tmp_path):
    records = json.loads(TRACE.read_text())
    cut = next(i for i, r in enumerate(records) if r["id"] == 9)
    parts = [_write(tmp_path / "trace.json.0", records[:cut]), _write(tmp_path / "trace.json.1", records[cut:])]
    _same(read_triton_trace(parts, model="bert_tiny"), read_triton_trace(TRACE, model="bert_tiny"))


def test_a_file_without_its_closing_bracket_or_with_a_cut_record_is_read_with_a_warning(tmp_path):
    whole = read_triton_trace(TRACE, model="bert_tiny")
    text = TRACE.read_text()
    open_end = tmp_path / "open.json"
    open_end.write_text(text.rstrip()[:-1])
    tt = read_triton_trace(open_end, model="bert_tiny")
    _same(tt, whole)
    assert len(tt.warnings) == 1 and "ends without ']'" in tt.warnings[0]
    # Cut inside the last request's records: that request loses timestamps, the rest stay.
    records = json.loads(text)
    last = max(r["id"] for r in records if r.get("model_name") == "bert_tiny")
    upto = next(i for i, r in enumerate(records) if r["id"] == last
                and r.get("timestamps", [{}])[0].get("name") == "REQUEST_END")
    cut = tmp_path / "cut.json"
    body = "[" + ",".join(json.dumps(r) for r in records[:upto + 1])
    cut.write_text(body[:-7])  # in the middle of the REQUEST_END record
    tt = read_triton_trace(cut, model="bert_tiny")
    assert len(tt.trace) == 14 and "cut off at the end of the file" in tt.warnings[0]
    assert np.isnan(tt.extra["server_latency_us"][tt.trace.request_id == last]).all()


def test_the_older_one_record_per_trace_layout_is_read(tmp_path):
    stamps = _by_id(json.loads(TRACE.read_text()))
    old = [{"model_name": "bert_tiny", "model_version": 1, "id": tid, "parent_id": 0,
            "timestamps": [{"name": name.lower().replace("_", " ").replace("request ", "request handler "),
                            "ns": ns} for name, ns in s.items()]}
           for tid, s in stamps.items() if tid <= 14]
    _same(read_triton_trace(_write(tmp_path / "old.json", old)), read_triton_trace(TRACE, model="bert_tiny"))


@pytest.mark.parametrize("text, needle", [
    ("", "empty file"),
    ('{"id": 1}', "expected a JSON array"),
    ("[]", "holds no request"),
    ('[{"id": 1, "timestamps": []}, 5]', "record 1: expected a JSON object, got int"),
    ('[{"model_name": "m"}]', "record 0: no 'id'"),
    ('[{"id": -3}]', "id: -3 is not an integer >= 0"),
    ('[{"id": 1, "timestamps": {"name": "REQUEST_START"}}]', "timestamps: expected a list"),
    ('[{"id": 1, "timestamps": [{"name": "REQUEST_START", "ns": "x"}]}]', "timestamp REQUEST_START: 'x' is not an integer"),
    ('[{"id": 1, "timestamps": [{"ns": 5}]}]', "is not a {\"name\""),
    ('[{"id": 1, "model_name": "m"},\n{"id": 1, "timestamps": [{"name": "QUEUE_START", "ns": 5}]}]', "trace id 1 has no REQUEST_START"),
    ('[{"id": 1, "model_name": "m"},\n{"id": 1, "model_name": "n"}]', "is for model 'm'"),
    ('[{"id": 1, "timestamps": [{"name": "REQUEST_START", "ns": 9}, {"name": "REQUEST_END", "ns": 5}]}]', "REQUEST_END is before REQUEST_START"),
    ('[{"id": 1},\n {"id": 2} {"id": 3}]', ":2: expected ',' or ']' after record 1"),
    ('[{"id": 1},\n {"id": 2 "x"},\n {"id": 3}]', ":2: invalid JSON in record 1"),
    ('[{"id": 1}] x', "unexpected text after the closing ']'"),
])
def test_malformed_traces_give_one_line_naming_the_file_line_and_record(tmp_path, text, needle):
    p = tmp_path / "t.json"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        read_triton_trace(p)
    msg = str(e.value)
    assert needle in msg and msg.startswith(str(p)) and "\n" not in msg


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_cut_or_corrupted_file_gives_a_trace_or_one_line(tmp_path, data):
    text = TRACE.read_text()
    at = data.draw(st.integers(0, len(text)))
    how = data.draw(st.sampled_from(["cut", "replace", "insert"]))
    junk = data.draw(st.text(alphabet='{}[],:"0123456789-eEx \n', max_size=4))
    if how == "cut":
        text = text[:at]
    elif how == "replace":
        text = text[:at] + junk + text[at + len(junk):]
    else:
        text = text[:at] + junk + text[at:]
    p = tmp_path / "t.json"
    p.write_text(text)
    try:
        tt = read_triton_trace(p, model="bert_tiny")
    except InputError as e:
        assert "\n" not in str(e) and str(e).startswith(str(p))
        return
    t = tt.trace
    assert len(t) >= 1 and t.arrival_s[0] == 0 and np.all(np.diff(t.arrival_s) >= 0)
    assert len(np.unique(t.request_id)) == len(t)


def test_saved_trace_loads_with_the_extra_columns_ignored(tmp_path):
    tt = read_triton_trace(TRACE, model="bert_tiny")
    for name in ("t.csv", "t.parquet"):
        save_triton_trace(tt, tmp_path / name)
        back = load_trace(tmp_path / name)
        assert np.array_equal(back.arrival_s, tt.trace.arrival_s)
        assert np.array_equal(back.request_id, tt.trace.request_id)
    assert load_trace(tmp_path / "t.csv").meta["ignored_columns"] == list(EXTRA_COLUMNS)
    with pytest.raises(InputError, match="unknown trace extension"):
        save_triton_trace(tt, tmp_path / "t.txt")


def test_cli_trace_import(tmp_path):
    out = tmp_path / "arrivals.csv"
    proc = schedsim("trace", "import", TRACE, "--model", "bert_tiny", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 14 requests of bert_tiny over 0.275 s" in proc.stdout and "in 12 executions" in proc.stdout
    assert len(load_trace(out)) == 14
    assert_one_line_error(schedsim("trace", "import", TRACE, "--out", out), "choose one with --model")
    assert_one_line_error(schedsim("trace", "import", tmp_path / "absent.json", "--out", out), "no such trace file")
