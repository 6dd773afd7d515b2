"""schedsim live --backend triton without a server: answers to statuses, trace files, checks of the flags."""

import json

import numpy as np
import pytest

from schedsim.core.results import COMPLETED, FAILED, QUEUED, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT
from schedsim.errors import InputError
from schedsim.run.runner import RunSpec
from schedsim.triton.client import ClientRecord, _body_parts, _error_text
from schedsim.triton.live import TritonLiveSpec, _check, _statuses, read_trace_file


def test_answers_become_statuses():
    errors = ["", "Exceeds maximum queue size", "Request timeout expired", "ClientConnectorError: refused",
              "", ""]
    record = ClientRecord(np.zeros(6, np.int64), np.arange(6), np.array([5, 6, 7, 8, -1, 9]),
                          np.array([200, 400, 400, 0, 0, 500], np.int32), errors)
    assert _statuses(record, 6).tolist() == [COMPLETED, REJECTED_QUEUE_FULL, REJECTED_TIMEOUT, FAILED, QUEUED,
                                             FAILED]
    assert _statuses(record, 2).tolist() == [COMPLETED, REJECTED_QUEUE_FULL]


def test_a_trace_file_gives_each_request_its_timestamps(tmp_path):
    entries = [{"id": 1, "timestamps": [{"name": "HTTP_RECV_START", "ns": 10}]},
               {"id": 1, "model_name": "m", "model_version": 1, "request_id": "7"},
               {"id": 1, "timestamps": [{"name": "QUEUE_START", "ns": 12}]},
               {"id": 2, "model_name": "m", "model_version": 1, "request_id": "warmup"},
               {"id": 1, "timestamps": [{"name": "COMPUTE_START", "ns": 15}]}]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(entries))
    assert read_trace_file(path) == {"7": {"HTTP_RECV_START": 10, "QUEUE_START": 12, "COMPUTE_START": 15},
                                     "warmup": {}}
    assert read_trace_file(tmp_path / "missing.json") == {}


def test_request_bodies_are_kserve_json_around_the_id():
    prefix, suffix = _body_parts(4, 100, np.random.default_rng(0), priority=2, timeout_us=500)
    body = json.loads(prefix + b"42" + suffix)
    assert body["id"] == "42" and body["parameters"] == {"binary_data_output": True, "priority": 2, "timeout": 500}
    assert body["inputs"][0]["shape"] == [1, 4] and len(body["inputs"][0]["data"]) == 4
    assert _error_text(b'{"error":"Exceeds maximum queue size"}', 400) == "Exceeds maximum queue size"
    assert _error_text(b"<html>", 502).startswith("HTTP 502")


@pytest.mark.parametrize("kwargs, needle", [
    ({"url": "localhost:8000"}, "--triton-model"),
    ({"url": "localhost", "model_name": "m"}, "HOST:PORT"),
    ({"url": "h:1", "model_name": "m", "trace_rate": 10}, "--triton-trace-rate"),
    ({"model": "builtin:llama-1b"}, "--model builtin:llama-1b"),
    ({"trace_rate": 0}, "--triton-trace-rate"),
    ({"processes": 0}, "--client-processes"),
])
def test_flags_are_checked_before_anything_starts(tmp_path, kwargs, needle):
    spec = TritonLiveSpec(run=RunSpec(trace=tmp_path / "t.csv", out=tmp_path / "out"), **kwargs)
    with pytest.raises(InputError, match=needle):
        _check(spec)
