"""``--cpu``: pinning a measuring process to one CPU (schedsim.profiling.host), and its CLI wiring.

The pinning tests pin this test process and put its CPU set back afterwards (the
``restore_affinity`` fixture); the CLI tests pin only the subprocess they start.
"""

from __future__ import annotations

import json
import os

import pytest

from schedsim.profiling import host
from schedsim.errors import InputError
from cli_helpers import assert_one_line_error, schedsim

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                    reason="no os.sched_setaffinity on this platform")


@pytest.fixture
def restore_affinity():
    """The allowed CPUs (sorted), and this process's CPU set put back after the test."""
    before = os.sched_getaffinity(0)
    yield sorted(before)
    os.sched_setaffinity(0, before)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("host") / "t.csv"
    path.write_text("arrival_s,seq_len\n" + "".join(f"{i * 0.004:.6f},16\n" for i in range(50)))
    return path


# -- parse_cpu, _ranges ----------------------------------------------------------------------

@pytest.mark.parametrize("spec,expected", [
    (None, None), ("", None), ("auto", "auto"), (" AUTO ", "auto"), ("0", 0), ("7", 7), (3, 3), (" 12 ", 12),
])
def test_parse_cpu_valid(spec, expected):
    assert host.parse_cpu(spec) == expected


@pytest.mark.parametrize("spec,needle", [
    ("banana", "not valid"), ("1.5", "not valid"), ("0,1", "not valid"), ("-1", ">= 0"), (-2, ">= 0"),
])
def test_parse_cpu_invalid_names_the_flag(spec, needle):
    with pytest.raises(InputError, match="--cpu") as err:
        host.parse_cpu(spec)
    assert needle in str(err.value)


@pytest.mark.parametrize("cpus,text", [
    ([], ""), ([3], "3"), ([0, 1], "0-1"), ([0, 1, 2, 5], "0-2,5"), ([1, 3, 4, 5, 7, 9, 10], "1,3-5,7,9-10"),
])
def test_ranges(cpus, text):
    assert host._ranges(cpus) == text


def test_pin_none_does_nothing():
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    assert host.pin_cpu(None) is None
    assert host.pin_cpu("") is None
    if before is not None:
        assert os.sched_getaffinity(0) == before


def test_no_affinity_support_is_an_input_error(monkeypatch):
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    with pytest.raises(InputError, match="--cpu: .*Linux only"):
        host.pin_cpu("0")


# -- pinning this process (put back afterwards) ----------------------------------------------

@needs_affinity
def test_pin_to_a_given_cpu(restore_affinity):
    cpu = restore_affinity[-1]
    record = host.pin_cpu(str(cpu))
    assert os.sched_getaffinity(0) == {cpu}
    assert record["cpu"] == cpu and record["how"] == "given"
    assert record["allowed_cpus"] == restore_affinity
    assert record["loop_ms"] > 0 and "probe_loop_ms" not in record
    json.dumps(record)  # goes into JSON provenance as it is


@needs_affinity
def test_auto_pins_to_one_allowed_cpu_and_records_the_probe(restore_affinity):
    record = host.pin_cpu("auto")
    assert record["how"] == "auto" and record["cpu"] in restore_affinity
    assert os.sched_getaffinity(0) == {record["cpu"]}
    probe = record["probe_loop_ms"]
    assert set(probe) == {str(c) for c in restore_affinity}
    assert all(v > 0 for v in probe.values())
    assert probe[str(record["cpu"])] == min(probe.values())


@needs_affinity
def test_auto_takes_the_fastest_cpu_of_the_probe(restore_affinity, monkeypatch):
    fake = {c: 2.0 + i for i, c in enumerate(reversed(restore_affinity))}  # the lowest CPU is slowest
    monkeypatch.setattr(host, "probe_cpus", lambda cpus: {c: fake[c] for c in cpus})
    record = host.pin_cpu("auto")
    assert record["cpu"] == restore_affinity[-1] == min(fake, key=fake.get)
    assert os.sched_getaffinity(0) == {restore_affinity[-1]}


@needs_affinity
def test_auto_with_a_count_takes_that_many_fastest(restore_affinity, monkeypatch):
    if len(restore_affinity) < 2:
        pytest.skip("needs two CPUs")
    fake = {c: 2.0 + i for i, c in enumerate(reversed(restore_affinity))}
    monkeypatch.setattr(host, "probe_cpus", lambda cpus: {c: fake[c] for c in cpus})
    record = host.pin_cpu("auto", count=2)
    two = sorted(restore_affinity[-2:])
    assert record["cpu"] == restore_affinity[-1] and record["cpus"] == two
    assert os.sched_getaffinity(0) == set(two)   # both, for two instances' threads
    given = host.pin_cpu(str(restore_affinity[0]), count=2)   # a given CPU is taken as it is
    assert given["cpus"] == [restore_affinity[0]] and os.sched_getaffinity(0) == {restore_affinity[0]}


def test_live_runs_get_a_cpu_per_instance_and_one_for_the_load_generator():
    assert [host.live_cpu_count(n) for n in (0, 1, 2, 4)] == [2, 2, 3, 5]


@needs_affinity
def test_set_process_cpus_moves_threads_started_before_it(restore_affinity):
    import threading

    release, started = threading.Event(), threading.Event()

    def wait():
        started.set()
        release.wait(10)

    t = threading.Thread(target=wait)
    t.start()
    started.wait(10)
    try:
        one = {restore_affinity[-1]}
        host.set_process_cpus(one)   # os.sched_setaffinity(0, ...) would move this thread alone
        assert os.sched_getaffinity(t.native_id) == one and os.sched_getaffinity(0) == one
    finally:
        host.set_process_cpus(restore_affinity)
        release.set()
        t.join(10)
    assert sorted(os.sched_getaffinity(0)) == restore_affinity


@needs_affinity
def test_probe_leaves_the_cpu_set_as_it_was(restore_affinity):
    probe = host.probe_cpus(restore_affinity, rounds=1, loops=2)
    assert sorted(probe) == restore_affinity and all(v > 0 for v in probe.values())
    assert sorted(os.sched_getaffinity(0)) == restore_affinity


@needs_affinity
def test_a_cpu_not_allowed_is_an_input_error(restore_affinity):
    cpu = restore_affinity[-1] + 1
    with pytest.raises(InputError, match=f"--cpu: {cpu} is not one of the CPUs") as err:
        host.pin_cpu(cpu)
    assert host._ranges(restore_affinity) in str(err.value)
    assert sorted(os.sched_getaffinity(0)) == restore_affinity  # nothing pinned


# -- the CLI: schedsim live / profile --cpu --------------------------------------------------

@pytest.mark.parametrize("args", [
    ["--cpu", "banana"],
    ["--cpu", "-3"],
    ["--backend", "torch-llm", "--policy", "continuous", "--cpu", "banana"],
])
def test_live_bad_cpu_is_one_line_exit_2(trace, tmp_path, args):
    assert_one_line_error(schedsim("live", trace, *args, "--out", tmp_path / "x"), "--cpu")


@needs_affinity
def test_live_cpu_not_allowed_is_one_line_exit_2(trace, tmp_path):
    assert_one_line_error(schedsim("live", trace, "--cpu", "9999", "--out", tmp_path / "x"),
                          "--cpu", "9999")


def test_profile_bad_cpu_is_one_line_exit_2(tmp_path):
    proc = schedsim("profile", "--model", "builtin:bert-tiny", "--cpu", "banana", "--out", tmp_path / "x.csv")
    assert_one_line_error(proc, "--cpu")


@needs_affinity
def test_live_records_the_pinning(trace, tmp_path):
    pytest.importorskip("onnxruntime")
    cpu = min(os.sched_getaffinity(0))
    out = tmp_path / "live"
    proc = schedsim("live", trace, "--policy", "dynamic", "--max-batch-size", "4", "--backend", "onnxruntime",
                    "--model", "builtin:bert-tiny", "--cpu", cpu, "--out", out)
    assert proc.returncode == 0, proc.stderr
    pinning = json.loads((out / "live.json").read_text())["machine"]["cpu_pinning"]
    assert pinning["cpu"] == cpu and pinning["how"] == "given"


@needs_affinity
def test_live_auto_pins_a_cpu_per_instance_plus_one(trace, tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "live"
    proc = schedsim("live", trace, "--policy", "dynamic", "--max-batch-size", "4", "--backend", "onnxruntime",
                    "--model", "builtin:bert-tiny", "--cpu", "auto", "--out", out)
    assert proc.returncode == 0, proc.stderr
    pinning = json.loads((out / "live.json").read_text())["machine"]["cpu_pinning"]
    assert len(pinning["cpus"]) == min(2, len(os.sched_getaffinity(0))) and pinning["how"] == "auto"


@needs_affinity
def test_profile_records_the_pinning(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from schedsim.live.engines.onnx_export import make_encoder_onnx

    model = make_encoder_onnx(tmp_path / "tiny.onnx", layers=1, hidden=32, heads=2, ffn=64, vocab=500,
                              max_positions=64)
    cpu = max(os.sched_getaffinity(0))
    out = tmp_path / "p.csv"
    proc = schedsim("profile", "--model", model, "--backend", "onnxruntime", "--batch-sizes", "1,2",
                    "--seq-lens", "8", "--warmup-ms", "1", "--min-iters", "3", "--min-time-s", "0",
                    "--dispatch-iters", "0", "--cpu", cpu, "--out", out)
    assert proc.returncode == 0, proc.stderr
    machine = json.loads(out.with_suffix(".json").read_text())["machine"]
    assert machine["cpu_pinning"]["cpu"] == cpu

