"""``schedsim live`` and ``schedsim validate`` as commands, in a subprocess (CPU, ONNX Runtime)."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest

from cli_helpers import PROFILE, assert_one_line_error, schedsim

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("live") / "t.csv"
    rows = ["arrival_s,seq_len"] + [f"{i * 0.004:.6f},16" for i in range(250)]
    path.write_text("\n".join(rows) + "\n")
    return path


POLICY = ["--policy", "dynamic", "--max-batch-size", "8", "--max-queue-delay-us", "500"]


@pytest.fixture(scope="module")
def live_dir(trace, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "live"
    proc = schedsim("live", trace, *POLICY, "--backend", "onnxruntime", "--model", "builtin:bert-tiny",
                    "--warmup-s", "0.1", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "issue lateness" in proc.stdout and "completed" in proc.stdout
    return out


def test_live_writes_what_run_writes_plus_engine_timings(live_dir):
    for name in ("requests.csv", "summary.json", "batches.csv", "live.json", "bert-tiny.onnx"):
        assert (live_dir / name).is_file(), name
    s = json.loads((live_dir / "summary.json").read_text())
    assert s["completed"] == s["requests"] == 225 and s["partial"] is False
    assert s["config"]["driver"] == "live" and s["config"]["backend"] == "onnxruntime"
    assert s["config"]["params"] == {"max_batch_size": 8, "max_queue_delay_us": 500}
    info = json.loads((live_dir / "live.json").read_text())
    assert "machine" in info and info["engine_host_ms"]["n"] > 0
    assert info["machine"]["cpu_pinning"] is None  # no --cpu: not pinned, and says so
    rows = list(csv.DictReader(open(live_dir / "batches.csv")))
    assert rows and float(rows[0]["host_ms"]) > 0


def test_validate_against_schedsim_run(trace, live_dir, tmp_path):
    sim = tmp_path / "sim"
    proc = schedsim("run", trace, *POLICY, "--profile", PROFILE, "--warmup-s", "0.1", "--out", sim)
    assert proc.returncode == 0, proc.stderr
    proc = schedsim("validate", "--sim", sim, "--live", live_dir, "--out", tmp_path / "v", "--plot")
    assert proc.returncode == 0, proc.stderr
    assert "KS statistic" in proc.stdout
    v = json.loads((tmp_path / "v" / "validation.json").read_text())
    for key in ("p50_err_pct", "p99_err_pct", "mean_err_pct", "throughput_err_pct", "ks_stat"):
        assert key in v
    assert (tmp_path / "v" / "latency_cdf_validation.png").is_file()


def test_validate_takes_several_live_runs(trace, live_dir, tmp_path):
    sim = tmp_path / "sim"
    assert schedsim("run", trace, *POLICY, "--profile", PROFILE, "--warmup-s", "0.1", "--out", sim).returncode == 0
    proc = schedsim("validate", "--sim", sim, "--live", live_dir, "--live", live_dir, "--out", tmp_path / "v")
    assert proc.returncode == 0, proc.stderr
    assert "the median of 2 live runs" in proc.stdout and "range" in proc.stdout
    v = json.loads((tmp_path / "v" / "validation.json").read_text())
    one = json.loads((live_dir / "summary.json").read_text())["p99_ms"]
    assert v["live_runs"] == 2 and v["metrics"]["p99"]["measured_runs"] == [one, one]


def test_time_limit_marks_the_outputs_partial(trace, tmp_path):
    proc = schedsim("live", trace, *POLICY, "--backend", "onnxruntime", "--model", "builtin:bert-tiny",
                    "--time-limit-s", "0.3", "--out", tmp_path / "p")
    assert proc.returncode == 0, proc.stderr
    assert "PARTIAL: time limit" in proc.stdout
    s = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert s["partial"] is True and s["partial_reason"] == "time limit" and s["requests"] < 250
    proc = schedsim("validate", "--sim", tmp_path / "p", "--live", tmp_path / "p")
    assert_one_line_error(proc, "partial")


@pytest.mark.parametrize("args,needle", [
    (["--backend", "tensorrt"], "TensorRT is not installed"),
    (["--backend", "onnxruntime", "--model", "nowhere.onnx"], "no such file"),
    (["--backend", "torch", "--model", "m.onnx"], "builtin models"),
    (["--backend", "onnxruntime", "--model", "builtin:bert-huge"], "builtin"),
    (["--backend", "onnxruntime", "--model", "builtin:bert-tiny", "--seq-len", "0"], "--seq-len"),
    (["--backend", "mxnet"], "--backend"),
])
def test_bad_live_input_is_one_line_exit_2(trace, tmp_path, args, needle):
    if "tensorrt" in args and importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    assert_one_line_error(schedsim("live", trace, *POLICY, *args, "--out", tmp_path / "x"), needle)


def test_no_cuda_is_a_clear_error(trace, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = schedsim("live", trace, *POLICY, "--backend", "torch", "--model", "builtin:bert-tiny",
                    "--device", "cuda", "--out", tmp_path / "x")
    assert_one_line_error(proc, "no CUDA device")


def test_model_too_small_for_the_trace(tmp_path):
    long = tmp_path / "long.csv"
    long.write_text("arrival_s,seq_len\n0.0,600\n0.01,600\n")
    proc = schedsim("live", long, *POLICY, "--backend", "onnxruntime", "--model", "builtin:bert-tiny",
                    "--out", tmp_path / "x")
    assert_one_line_error(proc, "seq_len up to 512")


def test_validate_missing_directory(tmp_path):
    assert_one_line_error(schedsim("validate", "--sim", tmp_path / "a", "--live", tmp_path / "b"),
                          "no such directory")
