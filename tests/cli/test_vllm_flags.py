"""schedsim run with vLLM's scheduler flags: presets, switches and their errors, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, schedsim

SAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "azure_sample.csv"


def run_json(*flags):
    proc = schedsim("run", SAMPLE, "--policy", "paged-kv", *flags, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_presets_and_switches_reach_the_policy():
    current, old = run_json(), run_json("--vllm-compat", "0.8")
    assert round(current["ttft_p50_ms"], 2) == 14.43 and round(old["ttft_p50_ms"], 2) == 14.73
    # The earlier model is current with async scheduling off here (no prefix ids, no KV pressure).
    assert run_json("--no-async-scheduling")["ttft_p50_ms"] == old["ttft_p50_ms"]
    spec = run_json("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.6}')
    assert spec["tpot_p50_ms"] < current["tpot_p50_ms"]
    assert spec["config"]["policy_stats"]["spec_draft_tokens"] > 0


@pytest.mark.parametrize("flags, needles", [
    (["--vllm-compat", "0.9"], ["--vllm-compat", "0.8, 0.10, current"]),
    (["--scheduling-policy", "lifo"], ["--scheduling-policy", "fcfs or priority"]),
    (["--speculative-config", "{bad"], ["--speculative-config", "not JSON"]),
    (["--no-enable-chunked-prefill", "--max-num-batched-tokens", "16"], ["--max-num-batched-tokens", "--max-model-len"]),
    (["--max-num-partial-prefills", "0"], ["--max-num-partial-prefills"]),
])
def test_bad_vllm_flags_are_one_line_errors(flags, needles):
    assert_one_line_error(schedsim("run", SAMPLE, "--policy", "paged-kv", *flags), *needles)


def test_paged_kv_flags_are_refused_by_other_llm_policies():
    proc = schedsim("run", SAMPLE, "--policy", "continuous", "--scheduling-policy", "priority")
    assert proc.returncode == 2 and "scheduling_policy" in proc.stderr.replace("-", "_")
