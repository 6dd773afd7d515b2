"""Bad paths, seeds, sizes and parameters: one line naming the flag, exit 2, before any work."""

from __future__ import annotations

import pytest

from cli_helpers import PROFILE, ROOT, TRACE, assert_one_line_error, schedsim

PLOT_PROFILE = ROOT / "profiles" / "bert-base-fp16-cg-h200.csv"
MY_POLICY = "docs/examples/my_policy.py:MyPolicy"


@pytest.fixture()
def a_file(tmp_path):
    path = tmp_path / "taken"
    path.write_text("not a directory\n")
    return path


def _out_commands(out):
    return {
        "run": ("run", TRACE, "--profile", PROFILE, "--out", out),
        "sweep": ("sweep", TRACE, "--profile", PROFILE, "--grid", "max_queue_delay_us=0,100", "--out", out),
        "plan": ("plan", "--qps", "1000", "--slo-p99-ms", "50", "--requests", "200", "--out", out),
        "autoscale": ("autoscale", TRACE, "--out", out),
    }


@pytest.mark.parametrize("command", ["run", "sweep", "plan", "autoscale"])
def test_out_that_is_a_file_is_refused(command, a_file):
    proc = schedsim(*_out_commands(a_file)[command])
    assert_one_line_error(proc, "--out", str(a_file), "is a file")
    assert a_file.read_text() == "not a directory\n"


@pytest.mark.parametrize("command", ["run", "sweep", "plan"])
def test_out_that_cannot_be_created_is_refused(command, a_file):
    out = a_file / "below"  # a directory cannot be made under a file
    proc = schedsim(*_out_commands(out)[command])
    assert_one_line_error(proc, "--out", str(out), "cannot create the directory")


def test_trace_gen_out_that_is_a_directory_is_refused(tmp_path):
    proc = schedsim("trace", "gen", "--out", tmp_path, "--seed", "1", "--rate", "10", "--n", "10")
    assert_one_line_error(proc, "--out", str(tmp_path), "is a directory")


def test_trace_gen_out_under_a_file_is_refused(a_file):
    out = a_file / "t.csv"
    proc = schedsim("trace", "gen", "--out", out, "--seed", "1", "--rate", "10", "--n", "10")
    assert_one_line_error(proc, "--out", str(out), "is a file")


@pytest.mark.parametrize("where", ["dir", "under-file"])
def test_profile_show_plot_path_is_checked_before_loading(where, tmp_path, a_file):
    plot = tmp_path if where == "dir" else a_file / "sub" / "p.png"
    proc = schedsim("profile", "show", PLOT_PROFILE, "--plot", plot)
    assert_one_line_error(proc, "--plot")


def test_negative_seed_is_refused_by_run_before_simulating(tmp_path):
    out = tmp_path / "out"
    proc = schedsim("run", TRACE, "--profile", PROFILE, "--seed", "-1", "--out", out)
    assert_one_line_error(proc, "--seed", "-1", ">= 0")
    assert not out.exists()


def test_negative_seed_is_refused_by_trace_gen(tmp_path):
    out = tmp_path / "t.csv"
    proc = schedsim("trace", "gen", "--out", out, "--seed", "-3", "--rate", "10", "--n", "10")
    assert_one_line_error(proc, "--seed", "-3")
    assert not out.exists()


@pytest.mark.parametrize("size", [("--duration-s", "1e12"), ("--n", "1000000000000")])
def test_trace_gen_refuses_absurd_sizes_saying_how_many(size, tmp_path):
    proc = schedsim("trace", "gen", "--out", tmp_path / "t.csv", "--seed", "1", "--rate", "1e6", *size)
    assert_one_line_error(proc, "would make about", "requests", "at most 200,000,000")


@pytest.mark.parametrize("value", ["abc", "1.5", "true"])
def test_user_policy_param_of_the_wrong_type_is_one_line(value):
    proc = schedsim("run", TRACE, "--policy", MY_POLICY, "--param", "batch_size=8",
                    "--param", f"timeout_us={value}")
    assert_one_line_error(proc, "timeout_us", "int")


def test_user_policy_constructor_errors_are_one_line(tmp_path):
    policy = tmp_path / "unannotated.py"
    policy.write_text((ROOT / "docs" / "examples" / "my_policy.py").read_text().replace(
        "def __init__(self, batch_size: int = 8, timeout_us: int = 500)",
        "def __init__(self, batch_size=8, timeout_us=500)"))
    proc = schedsim("run", TRACE, "--policy", f"{policy}:MyPolicy", "--param", "timeout_us=abc")
    assert_one_line_error(proc, "--policy", "ValueError")


def test_user_policy_integral_float_is_accepted():
    proc = schedsim("run", TRACE, "--policy", MY_POLICY, "--param", "batch_size=8",
                    "--param", "timeout_us=800.0", "--json")
    assert proc.returncode == 0, proc.stderr


def test_output_files_honour_the_umask(tmp_path):
    out = tmp_path / "out"
    proc = schedsim("run", TRACE, "--profile", PROFILE, "--out", out)
    assert proc.returncode == 0, proc.stderr
    for name in ("requests.csv", "summary.json"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask():
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_run_help_shows_the_batcher_defaults():
    proc = schedsim("run", "--help")
    text = " ".join(proc.stdout.replace("\u2502", " ").split())  # rich's box edges
    assert "(default 64)" in text and "(default 0)" in text
