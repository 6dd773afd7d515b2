"""Inputs that used to give wrong figures with exit 0: refused, or handled and said."""

from __future__ import annotations

import json

import pytest

from cli_helpers import PROFILE, TRACE, assert_one_line_error, schedsim


def _trace(path, arrivals):
    path.write_text("arrival_s\n" + "\n".join(arrivals) + "\n")
    return path


@pytest.mark.parametrize("late", ["1e10", "1e308", "9300000000"])
def test_arrivals_past_int64_nanoseconds_are_refused_with_the_row(tmp_path, late):
    trace = _trace(tmp_path / "t.csv", ["0", "0.001", "0.002", late])
    proc = schedsim("run", trace, "--profile", PROFILE)
    assert_one_line_error(proc, f"{trace}:5", "arrival_s", "int64 nanoseconds")


def test_rate_scale_past_int64_nanoseconds_is_refused(tmp_path):
    trace = _trace(tmp_path / "t.csv", ["0", "1", "8e9"])
    proc = schedsim("run", trace, "--profile", PROFILE, "--rate-scale", "0.5")
    assert_one_line_error(proc, "rate scale", "int64 nanoseconds")


def test_unix_epoch_arrivals_are_measured_from_the_first_and_said(tmp_path):
    step = [i * 0.0005 for i in range(400)]
    epoch = _trace(tmp_path / "epoch.csv", [f"{1.7e9 + t:.4f}" for t in step])
    zero = _trace(tmp_path / "zero.csv", [f"{t:.4f}" for t in step])
    runs = {}
    for name, trace in (("epoch", epoch), ("zero", zero)):
        proc = schedsim("run", trace, "--profile", PROFILE, "--json")
        assert proc.returncode == 0, proc.stderr
        runs[name] = json.loads(proc.stdout)
    e, z = runs["epoch"], runs["zero"]
    assert e["config"]["arrival_offset_s"] == 1.7e9
    assert "measured from the first arrival" in e["notes"][0]
    assert e["utilization"] == pytest.approx(z["utilization"], rel=1e-3)
    assert e["utilization"][0] > 0.05
    assert e["throughput_rps"] == pytest.approx(z["throughput_rps"], rel=1e-3)
    assert "notes" not in z
    proc = schedsim("run", epoch, "--profile", PROFILE)
    assert "note: arrival times start at 1,700,000,000" in proc.stdout


def test_warmup_longer_than_the_trace_is_refused():
    proc = schedsim("run", TRACE, "--warmup-s", "1e6")
    assert_one_line_error(proc, "--warmup-s", "last arrival")


def test_triton_config_without_dynamic_batching_is_the_none_policy(tmp_path):
    config = tmp_path / "config.pbtxt"
    config.write_text('name: "bert"\nmax_batch_size: 64\ninstance_group [ { count: 2 kind: KIND_GPU } ]\n')
    proc = schedsim("run", TRACE, "--triton-config", config, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["config"]["policy"] == "none"
    assert summary["config"]["instances"] == 2
    assert set(summary["batch_size_histogram"]) == {"1"}
    assert "no dynamic_batching block" in summary["notes"][0]
    proc = schedsim("run", TRACE, "--triton-config", config, "--max-queue-delay-us", "100")
    assert_one_line_error(proc, "--max-queue-delay-us", "no dynamic_batching block")


def test_validate_checks_what_each_directory_is(tmp_path):
    trace = _trace(tmp_path / "t.csv", [f"{i * 0.001:.3f}" for i in range(200)])
    for name in ("a", "b"):
        assert schedsim("run", trace, "--profile", PROFILE, "--out", tmp_path / name).returncode == 0
    proc = schedsim("validate", "--sim", tmp_path / "a", "--live", tmp_path / "b")
    assert_one_line_error(proc, "--live", str(tmp_path / "b"), "simulation")
    assert not (tmp_path / "b" / "validation.json").exists()
    (tmp_path / "b" / "live.json").write_text("{}\n")
    proc = schedsim("validate", "--sim", tmp_path / "b", "--live", tmp_path / "a")
    assert_one_line_error(proc, "--sim", str(tmp_path / "b"), "live")


def test_trace_gen_refuses_zero_requests_and_cv_without_gamma(tmp_path):
    out = tmp_path / "t.csv"
    proc = schedsim("trace", "gen", "--out", out, "--seed", "1", "--rate", "10", "--n", "0")
    assert_one_line_error(proc, "--n", "0")
    proc = schedsim("trace", "gen", "--out", out, "--seed", "1", "--rate", "10", "--n", "10", "--cv", "3")
    assert_one_line_error(proc, "--cv", "gamma")
    assert not out.exists()


def test_a_run_owns_its_out_directory(tmp_path):
    trace = _trace(tmp_path / "t.csv", [f"{i * 0.001:.3f}" for i in range(200)])
    out = tmp_path / "out"
    assert schedsim("run", trace, "--profile", PROFILE, "--out", out, "--plot").returncode == 0
    assert (out / "queue_length.png").exists()
    before = (out / "summary.json").read_text()
    proc = schedsim("run", trace, "--profile", PROFILE, "--out", out, "--seed", "2")
    assert_one_line_error(proc, "--out", str(out), "not empty", "--overwrite")
    assert (out / "summary.json").read_text() == before
    (out / "notes.txt").write_text("mine\n")
    proc = schedsim("run", trace, "--profile", PROFILE, "--out", out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "requests.csv", "summary.json"]


def test_a_failed_run_takes_back_the_out_directory_it_created(tmp_path):
    bad = _trace(tmp_path / "bad.csv", ["0", "0.001", "oops"])
    out = tmp_path / "new" / "run"
    proc = schedsim("run", bad, "--profile", PROFILE, "--out", out)
    assert_one_line_error(proc, f"{bad}:4", "arrival_s")
    assert not (tmp_path / "new").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    proc = schedsim("run", bad, "--profile", PROFILE, "--out", mine)
    assert proc.returncode == 2
    assert mine.is_dir()  # the user's own directory stays
