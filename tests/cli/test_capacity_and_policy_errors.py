"""Capacity and headroom in what run prints and writes; a user's broken policy ends the run
with one line (spinning, stranding requests, raising), never a hang or a traceback."""

from __future__ import annotations

import json

from cli_helpers import ROOT, TRACE, assert_one_line_error, schedsim

POLICIES = ROOT / "tests" / "broken_policies.py"


def test_capacity_headroom_and_busy_time_are_printed_and_recorded():
    proc = schedsim("run", TRACE, "--policy", "none")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "capacity (req/s) 1,624.9" in out and "headroom (capacity / offered) 0.81x" in out
    assert ("capacity: saturation rate with requests always waiting (mean batch 1.0 samples): the offered "
            "load is 1.23x what it can take; instance utilisation is busy time, not headroom") in out
    summary = json.loads(schedsim("run", TRACE, "--json").stdout)
    # Busy 83% of the time, yet it takes 8x the load: batches grow with the queue.
    assert summary["utilization"][0] > 0.8 and summary["headroom"] > 8
    assert summary["capacity_rps"] == summary["capacity"]["saturation_rps"]
    assert summary["gpu_work_share"] == summary["offered_rps"] / summary["capacity_rps"]
    assert summary["capacity"]["saturation_mean_batch"] == 64.0


def test_an_slo_makes_the_capacity_the_highest_rate_meeting_it():
    summary = json.loads(schedsim("run", TRACE, "--slo-p99-ms", "5", "--json").stdout)
    cap = summary["capacity"]
    assert cap["slo"] == ["p99_ms<=5"]
    assert 0 < cap["slo_rps"] < cap["saturation_rps"] and summary["capacity_rps"] == cap["slo_rps"]
    at_capacity = json.loads(schedsim("run", TRACE, "--rate-scale", summary["headroom"] * 0.99, "--json").stdout)
    assert at_capacity["p99_ms"] <= 5
    proc = schedsim("run", TRACE, "--slo", "p99_ms<<5")
    assert_one_line_error(proc, "--slo")
    assert_one_line_error(schedsim("run", TRACE, "--slo", "nope_ms<=5"), "--slo", "nope_ms")


def test_llm_runs_report_token_capacity_and_their_settings(tmp_path):
    trace = tmp_path / "llm.csv"
    gen = schedsim("trace", "gen", "--out", trace, "--seed", "1", "--rate", "2", "--n", "100",
                   "--input-tokens", "lognormal:500:0.5", "--output-tokens", "lognormal:100:0.5")
    assert gen.returncode == 0, gen.stderr
    proc = schedsim("run", trace, "--policy", "paged-kv")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "capacity (output tokens/s)" in out and "headroom (capacity / offered)" in out
    assert "settings: paged-kv (block_size=16, max_num_seqs=256" in out
    summary = json.loads(schedsim("run", trace, "--policy", "paged-kv", "--json").stdout)
    assert summary["capacity_output_tokens_per_s"] > summary["output_tokens_per_s"]
    assert summary["headroom"] > 1
    assert summary["config"]["effective"]["policy"] == "paged-kv"
    assert_one_line_error(schedsim("run", trace, "--policy", "paged-kv", "--slo-p99-ms", "5"),
                          "--slo/--slo-p99-ms", "--slo-ttft-ms")


def test_a_users_broken_policy_is_one_line_naming_it(tmp_path):
    path = POLICIES
    for name, needles in {
        "Spin": ("woke 100,000 times in a row", "spins on its timer"),
        "Never": ("stopped at t = ", "requests queued and every instance idle"),
        "Same": ("Same asked to wake at",),
        "NotADecision": ("returned None, not a Decision",),
        "Raises": ("decide raised ZeroDivisionError", "broken_policies.py line"),
    }.items():
        out = tmp_path / name
        proc = schedsim("run", TRACE, "--policy", f"{path}:{name}", "--out", out)
        assert_one_line_error(proc, f"--policy {path}:{name}:", *needles)
        assert not (out / "summary.json").exists()
