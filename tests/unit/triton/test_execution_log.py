"""The model's execution log (schedsim.triton.execution_log): written per execution, read back
per request, windowed, robust to a line cut short by a dying server."""

import numpy as np
import pytest

from schedsim.errors import InputError
from schedsim.triton.execution_log import ExecutionLogWriter, per_request, read_execution_log, server_side_summary


def test_each_request_gets_its_executions_times_size_and_instance(tmp_path):
    a = ExecutionLogWriter(str(tmp_path), "enc_0_0")
    b = ExecutionLogWriter(str(tmp_path), "enc 0/1")  # a name unsafe for a file is made safe
    a.batch(1_000, 3_000, ["0", "1"])
    b.batch(2_000, 2_500, ["2"])
    a.batch(9_000, 9_900, ["3"])
    a.close()
    b.close()
    with open(tmp_path / "enc_0_0.log", "a") as f:
        f.write("10000 11")  # cut short: skipped
    log = read_execution_log(tmp_path)
    assert log == {"0": (1_000, 3_000, 2, "enc_0_0"), "1": (1_000, 3_000, 2, "enc_0_0"),
                   "2": (2_000, 2_500, 1, "enc_0_1"), "3": (9_000, 9_900, 1, "enc_0_0")}
    assert set(read_execution_log(tmp_path, since_ns=1_500, until_ns=5_000)) == {"2"}
    cols = per_request(log, range(5), t0_ns=1_000)
    assert cols["model_start_s"][:4].tolist() == [0.0, 0.0, 1e-6, 8e-6] and np.isnan(cols["model_start_s"][4])
    assert cols["model_batch_requests"].tolist() == [2, 2, 1, 1, -1] and cols["model_instance"][2] == "enc_0_1"
    sent = np.array([0.0, 0.0, 0.5e-6, 7e-6, 8e-6])
    s = server_side_summary(sent, cols["model_end_s"], np.array([True, True, True, True, True]))
    assert s["n"] == 4 and s["max_ms"] == pytest.approx(2e-3) and s["p50_ms"] == pytest.approx(1.95e-3)
    assert server_side_summary(sent, cols["model_end_s"], np.zeros(5, bool)) == {"n": 0}


def test_a_missing_log_is_one_line(tmp_path):
    with pytest.raises(InputError, match="no execution log"):
        read_execution_log(tmp_path / "nope")
