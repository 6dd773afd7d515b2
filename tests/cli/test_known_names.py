"""Triton's and vLLM's own names are accepted where users type them, and --help shows every
flag name whole at 80 columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cli_helpers import ROOT, TRACE, schedsim


def test_triton_names_are_aliases_of_the_batcher_flags():
    ours = json.loads(schedsim("run", TRACE, "--max-queue-delay-us", "500", "--preferred-batch-size", "8,16",
                               "--default-timeout-us", "100000", "--json").stdout)
    triton = json.loads(schedsim("run", TRACE, "--max-queue-delay-microseconds", "500",
                                 "--preferred-batch-sizes", "8,16", "--default-timeout-microseconds", "100000",
                                 "--json").stdout)
    assert ours["config"]["effective"] == triton["config"]["effective"]
    assert triton["config"]["effective"]["max_queue_delay_us"] == 500
    assert ours["p99_ms"] == triton["p99_ms"]


def test_vllm_names_are_aliases_of_the_llm_flags(tmp_path):
    trace = tmp_path / "llm.csv"
    schedsim("trace", "gen", "--out", trace, "--seed", "1", "--rate", "2", "--n", "40",
             "--input-tokens", "lognormal:300:0.5", "--output-tokens", "lognormal:50:0.5")
    ours = json.loads(schedsim("run", trace, "--policy", "paged-kv", "--num-gpu-blocks", "400",
                               "--preemption-mode", "swap", "--swap-space-gb", "2", "--json").stdout)
    vllm = json.loads(schedsim("run", trace, "--policy", "paged-kv", "--num-gpu-blocks-override", "400",
                               "--preemption-mode", "swap", "--swap-space", "2", "--json").stdout)
    assert ours["kv_blocks_total"] == vllm["kv_blocks_total"]
    assert ours["config"]["params"] == vllm["config"]["params"]
    assert vllm["config"]["params"]["num_gpu_blocks"] == 400 and vllm["config"]["params"]["swap_space_gb"] == 2


@pytest.mark.parametrize("command", [["run"], ["live"], ["sweep"], ["plan"], ["trace", "gen"], ["profile"]])
def test_help_at_80_columns_shows_every_flag_name_whole(command):
    env = dict(os.environ, COLUMNS="80")
    proc = subprocess.run([sys.executable, "-m", "schedsim.cli.main", *command, "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\u2026" not in proc.stdout   # rich's ellipsis for a cut name
    if command == ["run"]:
        for name in ("--max-queue-delay-microseconds", "--preferred-batch-size", "--num-gpu-blocks-override",
                     "--swap-space", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
                     "--block-size", "--slo-p99-ms"):
            assert name in proc.stdout
