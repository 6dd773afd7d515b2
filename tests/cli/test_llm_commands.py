"""``schedsim run`` with LLM policies, as a user runs it: a subprocess, outputs, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, schedsim

ROOT = Path(__file__).resolve().parents[2]
STEPS = ROOT / "tests" / "data" / "llm_steps_synthetic.csv"
AZURE = ROOT / "docs" / "examples" / "azure_sample.csv"
MOONCAKE = ROOT / "docs" / "examples" / "mooncake_sample.jsonl"
SHARED_CONV = ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"

SUMMARY_KEYS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
                "throughput_rps", "output_tokens_per_s", "preemptions", "max_running", "prefix_hit_rate")


@pytest.fixture(scope="module")
def token_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("llm") / "tokens.csv"
    rows = ["arrival_s,input_tokens,output_tokens"]
    rows += [f"{i * 0.02:.3f},{100 + 37 * (i % 11)},{5 + 3 * (i % 7)}" for i in range(200)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_paged_kv_writes_llm_outputs(tmp_path, token_trace):
    out = tmp_path / "out"
    proc = schedsim("run", token_trace, "--policy", "paged-kv", "--profile", STEPS,
                    "--num-gpu-blocks", "200", "--block-size", "16", "--max-num-seqs", "16",
                    "--slo-ttft-ms", "200", "--out", out, "--plot")
    assert proc.returncode == 0, proc.stderr
    for needle in ("TTFT", "TPOT", "ITL", "E2E", "output tokens/s", "KV blocks peak / total", "goodput"):
        assert needle in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    for key in SUMMARY_KEYS:
        assert key in summary
    assert summary["completed"] == 200
    header = (out / "requests.csv").read_text().splitlines()[0].replace('"', "")
    assert header.startswith("request_id,arrival_s,scheduled_s,first_token_s,end_s,ttft_ms,tpot_ms,e2e_ms")
    for name in ("steps.csv", "timeline.png", "latency_cdf.png"):
        assert (out / name).stat().st_size > 0


def test_same_seed_same_bytes(tmp_path, token_trace):
    outs = []
    for i in range(2):
        out = tmp_path / f"o{i}"
        proc = schedsim("run", token_trace, "--policy", "paged-kv", "--profile", STEPS,
                        "--num-gpu-blocks", "60", "--out", out)
        assert proc.returncode == 0, proc.stderr
        outs.append([(out / f).read_bytes() for f in ("requests.csv", "steps.csv")])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("policy,extra", [("continuous", ["--reservation", "pow2"]),
                                          ("static", ["--batch-size", "4"])])
def test_continuous_and_static_on_an_azure_trace(policy, extra):
    proc = schedsim("run", AZURE, "--policy", policy, "--profile", STEPS, "--max-model-len", "8192",
                    "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["completed"] + summary["rejected"] == summary["requests"]
    assert summary["preemptions"] == 0


def test_prefix_caching_on_mooncake_hits():
    proc = schedsim("run", MOONCAKE, "--policy", "paged-kv", "--profile", STEPS,
                    "--enable-prefix-caching", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["prefix_hit_rate"] > 0


@pytest.mark.skipif(not SHARED_CONV.exists(), reason="../shared/traces not present")
def test_newcomer_run_on_the_real_trace_with_bundled_defaults_only():
    proc = schedsim("run", SHARED_CONV, "--policy", "paged-kv", "--rate-scale", "20", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["completed"] > 0


def test_trace_without_token_columns_is_one_line_error():
    proc = schedsim("run", ROOT / "traces" / "poisson_2000rps.csv", "--policy", "paged-kv",
                    "--profile", STEPS)
    assert_one_line_error(proc, "output_tokens", "paged-kv")


def test_model_that_does_not_fit_the_memory_is_one_line_error(token_trace):
    proc = schedsim("run", token_trace, "--policy", "paged-kv", "--profile", STEPS,
                    "--model-spec", "llama-3.1-70b", "--gpu-memory-gb", "80")
    assert_one_line_error(proc, "llama-3.1-70b")


def test_inconsistent_flags_are_one_line_errors(token_trace):
    proc = schedsim("run", token_trace, "--policy", "paged-kv", "--profile", STEPS, "--reservation", "max")
    assert_one_line_error(proc, "reservation")
    proc = schedsim("run", token_trace, "--policy", "paged-kv", "--profile", STEPS,
                    "--num-gpu-blocks", "100", "--gpu-memory-gb", "80")
    assert_one_line_error(proc, "--num-gpu-blocks", "--gpu-memory-gb")
    proc = schedsim("run", ROOT / "traces" / "poisson_2000rps.csv", "--policy", "dynamic",
                    "--max-num-seqs", "8")
    assert_one_line_error(proc, "--max-num-seqs", "LLM")
    proc = schedsim("run", token_trace, "--policy", "paged-kv", "--profile", STEPS,
                    "--preemption-mode", "drop")
    assert_one_line_error(proc, "--preemption-mode")


def test_too_long_requests_are_rejected_and_the_run_goes_on(tmp_path, token_trace):
    out = tmp_path / "out"
    proc = schedsim("run", token_trace, "--policy", "paged-kv", "--profile", STEPS,
                    "--max-model-len", "300", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["rejected_too_long"] > 0 and summary["completed"] > 0
    assert "rejected_too_long" in (out / "requests.csv").read_text()


def test_missing_step_profile_is_one_line_error(token_trace, tmp_path):
    proc = schedsim("run", token_trace, "--policy", "paged-kv", "--profile", tmp_path / "nope.csv")
    assert_one_line_error(proc, "nope.csv")
