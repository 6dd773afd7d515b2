"""The real ``schedsim`` command in a subprocess: outputs, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import PROFILE, ROOT, TRACE, assert_one_line_error, schedsim  # noqa: F401


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "small.csv"
    lines = ["arrival_s"] + [f"{i * 0.0005:.6f}" for i in range(2000)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_on_bundled_defaults_prints_a_summary():
    proc = schedsim("run", TRACE, "--policy", "dynamic", "--max-queue-delay-us", "2000",
                    "--preferred-batch-size", "8,16,32")
    assert proc.returncode == 0, proc.stderr
    for needle in ("completed", "throughput (req/s)", "latency p99 (ms)", "latency p99.9 (ms)",
                   "mean batch size", "instance utilisation", "batch sizes", "bert-base-fp16-cg-h200"):
        assert needle in proc.stdout


def test_run_writes_requests_summary_and_plots(tmp_path, small_trace):
    out = tmp_path / "out"
    proc = schedsim("run", small_trace, "--profile", PROFILE, "--max-queue-delay-us", "1000",
                    "--out", out, "--plot")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    for key in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput_rps", "mean_batch_size",
                "completed", "rejected"):
        assert key in summary
    assert summary["completed"] == 2000
    header = (out / "requests.csv").read_text().splitlines()[0].replace('"', "")
    assert header == "request_id,arrival_s,start_s,end_s,latency_ms,queue_ms,batch_size,instance,status"
    for png in ("latency_cdf.png", "batch_size_hist.png", "queue_length.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_same_seed_same_bytes_different_seed_different(tmp_path, small_trace):
    runs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        proc = schedsim("run", small_trace, "--max-queue-delay-us", "1000", "--seed", seed,
                        "--out", tmp_path / name)
        assert proc.returncode == 0, proc.stderr
        runs[name] = (tmp_path / name / "requests.csv").read_bytes()
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]  # the default profile's measured spread is drawn per seed


def test_replications_report_confidence_intervals(small_trace):
    proc = schedsim("run", small_trace, "--replications", "3", "--json", "--warmup-s", "0.1")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["replications"] == 3
    low, high = summary["p99_ms_ci"]
    assert low <= summary["p99_ms"] <= high
    assert summary["requests"] == 1800  # arrivals before 0.1 s left out


def test_triton_config_sets_the_batcher(tmp_path, small_trace):
    config = tmp_path / "config.pbtxt"
    config.write_text('name: "bert"\nmax_batch_size: 16\n'
                      'dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500 }\n'
                      'instance_group [ { count: 2 kind: KIND_GPU } ]\n')
    proc = schedsim("run", small_trace, "--triton-config", config, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["config"]["instances"] == 2
    assert summary["config"]["params"]["preferred_batch_sizes"] == [4, 8]
    assert len(summary["utilization"]) == 2
    assert max(int(k) for k in summary["batch_size_histogram"]) <= 16


def test_user_policy_from_a_file(tmp_path, small_trace):
    policy = tmp_path / "pairs.py"
    policy.write_text(
        "from schedsim.core.policy import Decision, Launch, Policy\n"
        "class Pairs(Policy):\n"
        "    def __init__(self, size=2):\n"
        "        self.size = size\n"
        "    def reset(self, requests, instances):\n"
        "        super().reset(requests, instances)\n"
        "        self.queue = []\n"
        "    def on_arrivals(self, now_ns, first, stop):\n"
        "        self.queue.extend(range(first, stop))\n"
        "    def on_trace_end(self, now_ns):\n"
        "        self.size = 1\n"
        "    def decide(self, now_ns, idle):\n"
        "        launches = []\n"
        "        while idle and len(self.queue) >= self.size:\n"
        "            rows, self.queue = self.queue[:self.size], self.queue[self.size:]\n"
        "            launches.append(Launch(idle.pop(0), rows))\n"
        "        return Decision(launches)\n")
    proc = schedsim("run", small_trace, "--policy", f"{policy}:Pairs", "--param", "size=4", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["completed"] == 2000
    hist = {int(k): v for k, v in summary["batch_size_histogram"].items()}
    assert max(hist) == 4 and hist[4] * 4 >= 1980  # batches of 4; singles only after trace end


# --- bad input: one line, exit 2, nothing that looks complete ---------------------------------

@pytest.mark.parametrize("content, needles", [
    ("arrival_s\n0.1\nabc\n", ["bad.csv:3", "arrival_s", "'abc' is not a number"]),
    ("arrival_s\n0.1\n\n0.05\n", ["bad.csv:4", "arrival_s", "earlier than the previous"]),
    ("arrival_s\n-1\n", ["bad.csv:2", "arrival_s"]),
    ("arrival_s\n0.1\nnan\n", ["bad.csv:3", "arrival_s"]),
    ("time\n0.1\n", ["bad.csv", "arrival_s"]),
    ("arrival_s,batch\n0.1,1\n0.2,0\n", ["bad.csv:3", "batch"]),
    ("", ["bad.csv"]),
])
def test_bad_trace(tmp_path, content, needles):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    out = tmp_path / "out"
    assert_one_line_error(schedsim("run", path, "--out", out), *needles)
    assert not (out / "summary.json").exists()


def test_missing_trace_file(tmp_path):
    assert_one_line_error(schedsim("run", tmp_path / "nope.csv"), "nope.csv")


def test_request_above_max_batch_size(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("arrival_s,batch\n0.1,1\n0.2,80\n")
    assert_one_line_error(schedsim("run", path, "--max-batch-size", "64"),
                          "trace row 2", "batch 80 exceeds max_batch_size 64")


def test_profile_that_does_not_cover_the_batches(small_trace):
    assert_one_line_error(schedsim("run", small_trace, "--max-batch-size", "128"),
                          "covers batch sizes 1..64", "128", "--extrapolate")


def test_bad_profile(tmp_path, small_trace):
    profile = tmp_path / "p.csv"
    profile.write_text("batch,latency_ms_mean\n1,0.5\n")
    assert_one_line_error(schedsim("run", small_trace, "--profile", profile), "p.csv")


@pytest.mark.parametrize("args, needles", [
    (["--policy", "fastest"], ["--policy", "unknown policy 'fastest'"]),
    (["--policy", "static", "--max-queue-delay-us", "10"], ["unknown parameter 'max_queue_delay_us'"]),
    (["--max-batch-size", "0"], ["max_batch_size", "0"]),
    (["--preferred-batch-size", "8,x"], ["--preferred-batch-size"]),
    (["--preferred-batch-size", "128"], ["preferred_batch_size", "128"]),
    (["--timeout-action", "DROP"], ["timeout_action", "DROP"]),
    (["--plot"], ["--plot", "--out"]),
    (["--replications", "0"], ["--replications"]),
    (["--no-such-flag"], ["--no-such-flag"]),
    (["--policy", "nosuchmodule:Thing"], ["nosuchmodule"]),
])
def test_bad_flags(small_trace, args, needles):
    assert_one_line_error(schedsim("run", small_trace, *args), *needles)


def test_contention_profile_must_be_measured_with_several_instances(small_trace):
    assert_one_line_error(schedsim("run", small_trace, "--instances", "2", "--contention-profile", PROFILE),
                          "linear_profile.csv", "instances")


def test_default_profile_prices_two_instances_with_its_contention_profile(small_trace):
    proc = schedsim("run", small_trace, "--instances", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "2" in json.loads(proc.stdout)["config"]["contention_profiles"]


def test_malformed_triton_config(tmp_path, small_trace):
    config = tmp_path / "config.pbtxt"
    config.write_text("max_batch_size: 8\ndynamic_batching { prefered_batch_size: [4] }\n")
    assert_one_line_error(schedsim("run", small_trace, "--triton-config", config), "config.pbtxt:2:")


def test_trace_gen_bad_spec(tmp_path):
    assert_one_line_error(schedsim("trace", "gen", "--rate", "10", "--n", "5", "--seed", "1",
                                   "--batch", "weird:3", "--out", tmp_path / "t.csv"), "weird")
