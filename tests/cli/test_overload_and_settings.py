"""What a capacity planner reads: offered rate beside throughput, overload said plainly, the
settings used, and every batch size accounted for."""

from __future__ import annotations

import json

from cli_helpers import ROOT, TRACE, schedsim

GAMMA = ROOT / "traces" / "gamma_cv3_2000rps.csv"


def test_overload_is_warned_with_the_offered_rate():
    proc = schedsim("run", TRACE, "--policy", "none", "--rate-scale", "2.5")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "offered rate (req/s) 4,993.7" in out
    assert "warning: overloaded: throughput" in out and "below the offered 4,993.7 req/s" in out
    assert "the queue grew through the trace" in out
    summary = json.loads(schedsim("run", TRACE, "--policy", "none", "--rate-scale", "2.5", "--json").stdout)
    assert summary["throughput_rps"] < 0.95 * summary["offered_rps"]
    assert summary["warnings"][0].startswith("overloaded:")


def test_a_run_that_keeps_up_has_no_warning():
    proc = schedsim("run", TRACE, "--max-queue-delay-us", "500")
    assert proc.returncode == 0, proc.stderr
    assert "offered rate (req/s)" in proc.stdout
    assert "overloaded" not in proc.stdout
    summary = json.loads(schedsim("run", TRACE, "--max-queue-delay-us", "500", "--json").stdout)
    assert "warnings" not in summary
    assert abs(summary["offered_rps"] - summary["throughput_rps"]) < 0.01 * summary["offered_rps"]


def test_effective_settings_are_printed_and_recorded_defaults_included():
    summary = json.loads(schedsim("run", TRACE, "--json").stdout)
    assert summary["config"]["params"] == {}
    eff = summary["config"]["effective"]
    assert eff["policy"] == "dynamic" and eff["max_batch_size"] == 64 and eff["max_queue_delay_us"] == 0
    assert eff["preferred_batch_sizes"] == [64] and eff["instances"] == 1
    assert eff["profile"] == "bert-base-fp16-cg-h200.csv" and eff["device"] == "NVIDIA H200"
    out = " ".join(schedsim("run", TRACE).stdout.split())
    assert "settings: dynamic (max_batch_size=64, preferred_batch_sizes=[64], max_queue_delay_us=0" in out
    assert "1 instance, profile bert-base-fp16-cg-h200.csv (NVIDIA H200)" in out


def test_the_batch_size_line_drops_no_size_and_json_sorts_sizes_numerically():
    proc = schedsim("run", GAMMA, "--max-queue-delay-us", "500")
    # The line wraps at the terminal's width: join it back up to the settings line.
    text = proc.stdout[proc.stdout.index("batch sizes"):proc.stdout.index("settings:")]
    line = " ".join(text.split())
    summary = json.loads(schedsim("run", GAMMA, "--max-queue-delay-us", "500", "--json").stdout)
    hist = summary["batch_size_histogram"]
    assert len(hist) > 12
    assert f"{len(hist) - 11} other sizes" in line
    shares = [float(part.rsplit(" ", 1)[1].rstrip("%")) for part in line.split(": ", 1)[1].split(", ")]
    assert abs(sum(shares) - 100.0) < 0.6
    assert list(hist) == sorted(hist, key=int)


def test_summary_json_sorts_histogram_keys_numerically(tmp_path):
    proc = schedsim("run", GAMMA, "--max-queue-delay-us", "500", "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    hist = json.loads((tmp_path / "o" / "summary.json").read_text())["batch_size_histogram"]
    assert list(hist) == sorted(hist, key=int)


def test_llm_overload_is_warned(tmp_path):
    trace = tmp_path / "llm.csv"
    assert schedsim("trace", "gen", "--out", trace, "--seed", "1", "--rate", "50", "--n", "300",
                    "--input-tokens", "lognormal:1000:1", "--output-tokens", "lognormal:200:1").returncode == 0
    summary = json.loads(schedsim("run", trace, "--policy", "continuous", "--json").stdout)
    assert summary["offered_rps"] > 45
    assert any(w.startswith("overloaded:") for w in summary["warnings"])


def test_llm_long_generations_at_the_end_are_not_overload(tmp_path):
    """Throughput counts until the last token, so a light trace with long outputs falls below
    its offered rate without any queue: no overload warning then."""
    trace = tmp_path / "light.csv"
    assert schedsim("trace", "gen", "--out", trace, "--seed", "1", "--rate", "2", "--n", "40",
                    "--input-tokens", "fixed:200", "--output-tokens", "fixed:2000").returncode == 0
    summary = json.loads(schedsim("run", trace, "--policy", "paged-kv", "--json").stdout)
    assert summary["throughput_rps"] < 0.95 * summary["offered_rps"]  # the case the warning used to fire on
    assert not any(w.startswith("overloaded:") for w in summary.get("warnings", []))
