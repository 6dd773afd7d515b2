"""A real tritonserver on the CPU, driven by ``schedsim live --backend triton`` in a subprocess.

The bert-tiny model runs in Triton's Python backend (KIND_CPU, numpy). These tests skip
when no tritonserver is found (``python -m schedsim.triton.bundle install`` provides one);
CI sets SCHEDSIM_REQUIRE_TRITON=1, which turns the skip into a failure.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import ROOT, assert_one_line_error, schedsim
from schedsim.triton.server import ServerError, TritonServer, free_ports
from triton_helpers import INSTALL, poisson_trace, pytestmark  # noqa: F401 - skip/require a tritonserver

BURSTS = [3, 5, 8, 2, 7, 1, 4, 6, 8, 3]
"""Requests arriving at the same instant, 0.25 s apart: with a 100 ms queue delay and
max_batch_size 8, each burst is exactly one batch, in Triton as in the simulator."""
POLICY = ["--policy", "dynamic", "--max-batch-size", "8", "--max-queue-delay-us", "100000"]


def burst_trace(path: Path, bursts=BURSTS, gap_s: float = 0.25, seq_len: int = 16) -> Path:
    rows = ["request_id,arrival_s,seq_len"]
    i = 0
    for j, k in enumerate(bursts):
        for _ in range(k):
            rows.append(f"{i},{j * gap_s:.3f},{seq_len}")
            i += 1
    path.write_text("\n".join(rows) + "\n")
    return path


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_triton_forms_the_batches_the_simulator_forms(tmp_path):
    trace = burst_trace(tmp_path / "bursts.csv")
    live = schedsim("live", trace, "--backend", "triton", "--model", "builtin:bert-tiny", *POLICY,
                    "--triton-trace-rate", "1", "--out", tmp_path / "live", "--json")
    assert live.returncode == 0, live.stderr
    sim = schedsim("run", trace, *POLICY, "--profile", ROOT / "tests/data/linear_profile.csv",
                   "--out", tmp_path / "sim", "--json")
    assert sim.returncode == 0, sim.stderr
    got = json.loads(live.stdout)
    want = json.loads(sim.stdout)
    # Triton's own batch_stats: executions per batch size, read before and after the run.
    assert got["batch_size_histogram"] == want["batch_size_histogram"] == {"1": 1, "2": 1, "3": 2, "4": 1,
                                                                           "5": 1, "6": 1, "7": 1, "8": 2}
    assert got["completed"] == sum(BURSTS) and got["failed"] == 0 and not got["partial"]
    stats = json.loads((tmp_path / "live/triton_stats.json").read_text())
    assert stats["delta"]["execution_count"] == len(BURSTS)
    # Where the server's processes sat: tritonserver and its model's Python stub.
    placement = json.loads((tmp_path / "live/live.json").read_text())["server"]["placement"]
    assert placement[0]["name"] == "tritonserver" and len(placement) >= 2
    assert all(p["cpus_allowed"] and p["last_cpu"] >= 0 for p in placement)
    assert stats["delta"]["inference_stats"]["success"]["count"] == sum(BURSTS)
    # Traced at rate 1: each burst's requests share one compute start (one batch), and the
    # server's timestamps lie between the client's send and answer (one monotonic clock).
    rows = read_csv(tmp_path / "live/triton_requests.csv")
    starts, first = [], 0
    for k in BURSTS:
        burst = rows[first:first + k]
        first += k
        assert len({r["server_compute_start_s"] for r in burst}) == 1
        starts.append(float(burst[0]["server_compute_start_s"]))
        for r in burst:
            # (COMPUTE_END may be stamped after the response has left: not compared.)
            assert (float(r["sent_s"]) <= float(r["server_http_recv_start_s"]) <= float(r["server_request_start_s"])
                    <= float(r["server_compute_start_s"]) <= float(r["answered_s"]))
            assert r["status"] == "completed" and r["http_status"] == "200"
    assert starts == sorted(starts)
    # The model's own execution log holds every request, each burst in one execution, and
    # its times lie between the client's send and answer (one monotonic clock).
    first = 0
    for k in BURSTS:
        burst = rows[first:first + k]
        first += k
        assert len({r["model_start_s"] for r in burst}) == 1
        assert {r["model_batch_requests"] for r in burst} == {str(k)}
        for r in burst:
            assert float(r["sent_s"]) <= float(r["model_start_s"]) <= float(r["model_end_s"]) <= float(r["answered_s"])
    summary = json.loads((tmp_path / "live/summary.json").read_text())
    assert summary["config"]["backend"] == "triton" and summary["live"]["client_lateness_us"]["n"] == sum(BURSTS)
    assert summary["server_side"]["n"] == sum(BURSTS) and summary["server_side"]["p99_ms"] > 0
    assert "execution log" in summary["config"]["server_side_times"]
    check = schedsim("validate", "--sim", tmp_path / "sim", "--live", tmp_path / "live", "--json")
    assert check.returncode == 0, check.stderr
    config = (tmp_path / "live/model_repository/schedsim_encoder/config.pbtxt").read_text()
    assert "max_queue_delay_microseconds: 100000" in config and "KIND_CPU" in config


def test_a_server_that_cannot_load_the_model_gives_one_line_naming_its_log(tmp_path):
    if Path("/dev/nvidiactl").exists():
        pytest.skip("a GPU is visible: the KIND_GPU model would load")
    trace = burst_trace(tmp_path / "bursts.csv", [2])
    proc = schedsim("live", trace, "--backend", "triton", "--device", "cuda", *POLICY, "--out", tmp_path / "out")
    assert_one_line_error(proc, "tritonserver exited with code 1 before it was ready",
                          "failed to load 'schedsim_encoder'", str(tmp_path / "out" / "tritonserver.log"))


def test_a_model_that_fails_in_initialize_is_reported_with_its_log(tmp_path):
    from schedsim.triton.repository import model_config, write_repository

    bad = tmp_path / "bad_model.py"
    bad.write_text("class TritonPythonModel:\n    def initialize(self, args):\n"
                   "        raise RuntimeError('no weights here')\n")
    write_repository(tmp_path / "repo", "broken", model_config("broken", policy="none", params={}), bad)
    server = TritonServer(tmp_path / "repo", tmp_path / "server.log", INSTALL, ready_timeout_s=60)
    with pytest.raises(ServerError) as err:
        with server:
            pass
    assert "no weights here" in str(err.value) and str(tmp_path / "server.log") in str(err.value)
    assert "\n" not in str(err.value) and server.returncode is not None


def test_a_rejected_command_line_is_reported_by_its_reason_not_the_usage_text(tmp_path):
    # tritonserver prints its whole usage text, whose help lines mention "error", around
    # the one line that says what was wrong.
    from schedsim.triton.repository import model_config, write_repository

    ok = tmp_path / "ok_model.py"
    ok.write_text("class TritonPythonModel:\n    pass\n")
    write_repository(tmp_path / "repo", "ok", model_config("ok", policy="none", params={}), ok)
    (port,) = free_ports(1)
    server = TritonServer(tmp_path / "repo", tmp_path / "server.log", INSTALL, ready_timeout_s=60,
                          http_port=port, grpc_port=port)
    with pytest.raises(ServerError) as err:
        with server:
            pass
    message = str(err.value)
    assert "cannot listen to HTTP requests and GRPC requests at the same address and port" in message
    assert "--load-model" not in message and "\n" not in message and str(tmp_path / "server.log") in message


def test_a_port_taken_before_the_server_binds_it_is_chosen_again(tmp_path, monkeypatch):
    import socket

    from schedsim.triton import server as server_module
    from schedsim.triton.repository import model_config, write_repository

    ok = tmp_path / "ok_model.py"
    ok.write_text("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    write_repository(tmp_path / "repo", "ok", model_config("ok", policy="none", params={}), ok)
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        real, calls = server_module.free_ports, []

        def first_call_returns_a_taken_port(count):
            calls.append(count)
            ports = real(count)
            return [taken, *ports[1:]] if len(calls) == 1 else ports

        monkeypatch.setattr(server_module, "free_ports", first_call_returns_a_taken_port)
        with TritonServer(tmp_path / "repo", tmp_path / "server.log", INSTALL, ready_timeout_s=60) as server:
            assert server.http_port != taken and server.get("/v2/health/ready")[0] == 200
    assert len(calls) == 2


def _server_pid(out_dir: Path, timeout_s: float = 60.0) -> int:
    """The tritonserver serving OUT_DIR's repository (started by the run under test)."""
    deadline = time.monotonic() + timeout_s
    needle = f"--model-repository={out_dir / 'model_repository'}".encode()
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if needle in (proc / "cmdline").read_bytes():
                        return int(proc.name)
                except OSError:
                    continue
        time.sleep(0.1)
    raise AssertionError("the run's tritonserver never appeared")


def _wait_for_a_traced_batch(executions: Path, deadline: float) -> None:
    """Until the model has executed a batch of the trace's requests (its execution log has a
    line with a numeric request id; the client's warm-up requests are named "warmup"): on a
    loaded host the client can take seconds to start, and a kill before the trace's first
    answers tests less."""
    while True:
        for log in executions.glob("*.log"):
            for line in log.read_text(errors="replace").splitlines():
                parts = line.split(" ")
                if len(parts) == 4 and any(i.isdigit() for i in parts[3].split(",")):
                    time.sleep(0.2)  # its answers go out
                    return
        assert time.monotonic() < deadline, "the model executed none of the trace's requests"
        time.sleep(0.05)


def test_a_server_that_dies_mid_run_leaves_every_request_marked(tmp_path):
    trace = poisson_trace(tmp_path / "poisson.csv", rate=40, seconds=12)
    out = tmp_path / "out"
    # A 1 s queue delay with room for 64 keeps requests waiting in the server when it is killed
    # (all but the ~25 ms after each launch; with 200 ms and 8, a quiet host found none waiting).
    cmd = [sys.executable, "-m", "schedsim.cli.main", "live", str(trace), "--backend", "triton",
           "--policy", "dynamic", "--max-batch-size", "64", "--max-queue-delay-us", "1000000", "--out", str(out)]
    run = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = _server_pid(out)
        log = out / "tritonserver.log"
        deadline = time.monotonic() + 60
        while b"Started HTTPService" not in (log.read_bytes() if log.exists() else b""):
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.1)
        _wait_for_a_traced_batch(out / "executions", deadline=time.monotonic() + 90)
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    proc = subprocess.CompletedProcess(cmd, run.returncode, stdout, stderr)
    assert_one_line_error(proc, "tritonserver was killed by signal 9 during the run", str(log),
                          "requests written to", "(status marked)")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] and summary["partial_reason"] == "server died"
    rows = read_csv(out / "requests.csv")
    status = [r["status"] for r in rows]
    assert "completed" in status and "failed" in status
    assert summary["completed"] == sum(r["status"] == "completed" for r in rows) > 0
    client = read_csv(out / "triton_requests.csv")
    assert len(client) == len(rows)
    assert all(r["error"] for r in client if r["status"] == "failed")


def test_triton_url_drives_a_server_the_user_runs(tmp_path):
    from schedsim.triton.repository import model_config, write_repository

    params = {"max_batch_size": 8, "max_queue_delay_us": 100000}
    cfg = model_config("users_model", policy="dynamic", params=params, parameters={"seq_lens": "16"})
    write_repository(tmp_path / "repo", "users_model", cfg)
    trace = burst_trace(tmp_path / "bursts.csv", [4, 8, 2], gap_s=0.5)
    with TritonServer(tmp_path / "repo", tmp_path / "server.log", INSTALL) as server:
        proc = schedsim("live", trace, "--backend", "triton", *POLICY, "--triton-url", server.url,
                        "--triton-model", "users_model", "--warmup-s", "0.3", "--out", tmp_path / "out", "--json")
        assert server.alive()
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    # The first burst (4 requests at 0 s, one batch 100 ms in) falls in the warm-up: its
    # batch is left out as the simulator leaves it out, by reading the statistics at 0.3 s
    # (200 ms after that batch and before the next burst, at 0.5 s: room for a loaded host).
    assert summary["batch_size_histogram"] == {"2": 1, "8": 1} and summary["completed"] == 10
    stats = json.loads((tmp_path / "out" / "triton_stats.json").read_text())
    assert stats["delta"]["execution_count"] == 2 and stats["start"] != stats["before"]
    assert summary["config"]["triton_url"] == server.url
    assert not (tmp_path / "out" / "model_repository").exists()
    bad = schedsim("live", trace, "--backend", "triton", "--triton-url", server.url, "--out", tmp_path / "x")
    assert_one_line_error(bad, "--triton-model")
