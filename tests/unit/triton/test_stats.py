"""Triton statistics into cost tables: files recorded from a real CPU server, a stand-in HTTP
server for the URL path, and hypothesis for malformed input."""

from __future__ import annotations

import copy
import http.server
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import assert_one_line_error, schedsim
from schedsim.cost.model import CostModel
from schedsim.cost.profile import load_profile
from schedsim.errors import InputError
from schedsim.triton import stats as ts

DATA = Path(__file__).resolve().parents[2] / "data" / "triton" / "cpu"
ONE = DATA / "stats_bert_tiny.json"
ALL = DATA / "stats_all_models.json"
CONFIG = DATA / "config_bert_tiny.json"


def _doc(path=ONE) -> dict:
    return json.loads(path.read_text())


def test_fixture_becomes_one_row_per_batch_size_with_the_summed_stage_means(tmp_path):
    doc = _doc()
    prof, warnings = ts.import_profile(str(ONE), tmp_path / "p.csv")
    assert prof.batches.tolist() == [1, 2, 3]
    for entry in doc["model_stats"][0]["batch_stats"]:
        b = entry["batch_size"]
        want = sum(entry[k]["ns"] / entry[k]["count"] for k in ts.STAGES) / 1e6
        row = prof.table[prof.table["batch"] == b].iloc[0]
        assert row["latency_ms_mean"] == pytest.approx(want, rel=1e-12)
        assert row["n"] == entry["compute_infer"]["count"]
        assert row["latency_ms_p50"] == row["latency_ms_p99"] == row["latency_ms_mean"]
        assert row["latency_ms_std"] == 0
        assert float(row["compute_infer_ms_mean"]) == pytest.approx(entry["compute_infer"]["ns"] / entry["compute_infer"]["count"] / 1e6)
    meta = load_profile(tmp_path / "p.csv").meta
    assert meta["backend"] == "triton" and meta["model"] == "bert_tiny" and meta["model_version"] == "1"
    assert meta["source"] == str(ONE) and meta["spread"].startswith("unknown")
    assert meta["execution_count"] == 12 and meta["inference_count"] == 16
    assert meta["per_request_us"]["queue"] == pytest.approx(27920113 / 14 / 1e3, abs=1e-3)
    assert meta["last_inference"].startswith("2026-12-01")
    # Few executions are flagged, one warning per size.
    assert sum("only; its mean is uncertain" in w for w in warnings) == 3


def test_the_cost_model_takes_each_sizes_mean_without_spread(tmp_path):
    prof, _ = ts.import_profile(str(ONE), tmp_path / "p.csv")
    cost = CostModel.from_profile(load_profile(tmp_path / "p.csv"))
    assert cost.spread == "none"
    rng = np.random.default_rng(0)
    for b in (1, 2, 3):
        mean = float(prof.table.loc[prof.table["batch"] == b, "latency_ms_mean"].iloc[0]) / 1e3
        assert cost.mean_s(b) == pytest.approx(mean)
        assert cost.sample_s(b, 0, rng) == pytest.approx(mean)


def test_several_models_need_a_choice_and_an_unknown_one_is_named(tmp_path):
    with pytest.raises(InputError, match=r"2 model versions \(add_one \(version 1\), bert_tiny \(version 1\)\).*--model"):
        ts.import_profile(str(ALL), tmp_path / "p.csv")
    with pytest.raises(InputError, match=r"no statistics for model 'nope' \(the file has: add_one"):
        ts.import_profile(str(ALL), tmp_path / "p.csv", model="nope")
    prof, _ = ts.import_profile(str(ALL), tmp_path / "p.csv", model="add_one", version="1")
    assert prof.batches.tolist() == [1] and int(prof.columns["n"][0]) == 3


def test_gaps_and_missing_ends_are_flagged_and_follow_the_loaders_rules():
    info, warnings = ts.coverage([2, 3, 8], max_batch_size=16)
    assert info["interpolated_batches"] == [4, 5, 6, 7]
    assert info["below_table"] == [1] and info["above_table"] == [9, 16]
    assert len(warnings) == 3
    assert "4-7 were not executed" in warnings[0] and "interpolates" in warnings[0]
    assert "--extrapolate" in warnings[1] and "--extrapolate" in warnings[2]
    info, warnings = ts.coverage([1, 2, 4], max_batch_size=None)
    assert info == {"measured_batches": [1, 2, 4], "interpolated_batches": [3]} and len(warnings) == 1


def test_since_differences_two_snapshots_and_refuses_counters_going_down():
    after = ts.parse_stats(_doc(), "x")[0]
    before_doc = _doc()
    m = before_doc["model_stats"][0]
    m["batch_stats"] = m["batch_stats"][:1]
    for k in ts.STAGES:
        m["batch_stats"][0][k] = {"count": 4, "ns": 40_000}
    m["execution_count"] = 4
    before = ts.parse_stats(before_doc, "x")[0]
    d = after.since(before)
    assert d.execution_count == 8
    assert d.executions(1) == 5 and d.executions(2) == 2 and d.executions(3) == 1
    assert d.batches[1]["compute_infer"] == (5, 16396530 - 40_000)
    with pytest.raises(InputError, match="went down between two snapshots"):
        before.since(after)


def test_numbers_as_strings_are_read_as_protobuf_json_writes_them():
    doc = _doc()
    entry = doc["model_stats"][0]["batch_stats"][0]
    entry["compute_infer"] = {"count": "9", "ns": "16396530"}
    assert ts.parse_stats(doc, "x")[0].batches[1]["compute_infer"] == (9, 16396530)


@pytest.mark.parametrize("doc, needle", [
    ([], "expected a JSON object"),
    ({"error": "Request for unknown model: 'x' is not found"}, "the server answered an error: Request for unknown"),
    ({"models": []}, "no 'model_stats' field"),
    ({"model_stats": {}}, "not Triton statistics"),
    ({"model_stats": [{"name": "m", "batch_stats": [{"batch_size": 1.5}]}]}, "batch_size"),
    ({"model_stats": [{"name": "m", "batch_stats": [{"batch_size": 1, "compute_infer": {"count": "x"}}]}]}, "count"),
    ({"model_stats": [{"name": "m", "batch_stats": [{"batch_size": 0}]}]}, "batch_size: 0 must be >= 1"),
    ({"model_stats": [{"name": "m", "batch_stats": [{"batch_size": 2}, {"batch_size": 2}]}]}, "appears twice"),
    ({"model_stats": [{"version": "1"}]}, "name: missing"),
    ({"model_stats": []}, "no statistics"),
    ({"model_stats": [{"name": "m", "batch_stats": []}]}, "no executions in its batch_stats"),
])
def test_malformed_or_empty_statistics_give_one_line(tmp_path, doc, needle):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        ts.import_profile(str(p), tmp_path / "p.csv", model="m" if "name" in json.dumps(doc) else None)
    assert needle in str(e.value) and "\n" not in str(e.value) and str(p) in str(e.value)


def test_file_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "model_stats": [\n  }\n')
    with pytest.raises(InputError, match=r"bad.json:3: invalid JSON"):
        ts.read_stats(str(bad))
    (tmp_path / "empty.json").write_text("  \n")
    with pytest.raises(InputError, match="empty file"):
        ts.read_stats(str(tmp_path / "empty.json"))
    with pytest.raises(InputError, match="no such statistics file"):
        ts.read_stats(str(tmp_path / "absent.json"))


_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                  st.text(max_size=5), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


_ALL_PATHS = list(_paths(_doc(ALL)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(_ALL_PATHS), value=_LEAF, delete=st.booleans())
def test_any_corrupted_field_gives_a_table_or_one_line(path, value, delete):
    doc = copy.deepcopy(_doc(ALL))
    if path:
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        if delete and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    else:
        doc = value
    try:
        models = ts.parse_stats(doc, "s.json")
        for m in models:
            try:
                rows, _ = ts.cost_rows(m, "s.json")
            except InputError as e:
                assert "\n" not in str(e)
                continue
            assert all(r["latency_ms_mean"] > 0 and r["n"] >= 1 for r in rows)
    except InputError as e:
        msg = str(e)
        assert msg.startswith("s.json: ") and "\n" not in msg


class _Stub(http.server.BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self):
        code, body = self.routes.get(self.path, (400, {"error": f"unknown path {self.path}"}))
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_live_url_adds_the_server_and_the_models_configuration(tmp_path, stub_server):
    _Stub.routes = {"/v2/models/bert_tiny/stats": (200, _doc()),
                    "/v2": (200, {"name": "triton", "version": "2.51.0"}),
                    "/v2/models/bert_tiny/versions/1/config": (200, json.loads(CONFIG.read_text()))}
    prof, warnings = ts.import_profile(stub_server, tmp_path / "p.csv", model="bert_tiny")
    meta = prof.meta
    assert meta["source"] == f"http://{stub_server}/v2/models/bert_tiny/stats"
    assert meta["server"] == {"name": "triton", "version": "2.51.0"} and meta["backend_version"] == "2.51.0"
    assert meta["model_config"]["max_batch_size"] == 8 and meta["model_config"]["instances"] == 1
    assert meta["device"] == "KIND_CPU"
    assert meta["coverage"]["above_table"] == [4, 8]
    assert any("allows batches up to 8" in w for w in warnings)
    # Without --model the server's whole list is read; an unknown model is the server's one-line error.
    with pytest.raises(InputError, match=r"answered 400: unknown path /v2/models/nope/stats"):
        ts.import_profile(f"http://{stub_server}", tmp_path / "q.csv", model="nope")


def test_an_unreachable_server_is_one_line():
    with pytest.raises(InputError, match=r"http://127.0.0.1:9/v2/models/stats: cannot reach the server"):
        ts.read_stats("127.0.0.1:9", timeout_s=2)


def test_cli_import_writes_the_table_and_errors_are_one_line(tmp_path):
    out = tmp_path / "p.csv"
    proc = schedsim("profile", "import", ALL, "--model", "bert_tiny", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out} (3 batch sizes 1-3, 12 executions of bert_tiny" in proc.stdout
    assert "mean is uncertain" in proc.stderr
    assert load_profile(out).batches.tolist() == [1, 2, 3]
    assert_one_line_error(schedsim("profile", "import", ALL, "--out", out), "choose one with --model")
    assert_one_line_error(schedsim("profile", "import", ONE), "--out is required")
