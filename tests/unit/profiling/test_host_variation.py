"""The host-variation record (schedsim.profiling.host_variation): its figures from known
timings, the profiler's hook on a CPU engine, and the band it widens."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from schedsim.cost.profile import default_profile_path
from schedsim.errors import InputError
from schedsim.profiling.host_variation import combine, from_batches, measure, relative_to, summarise
from schedsim.run.runner import execute
from schedsim.run.spec import RunSpec
from cli_helpers import ROOT, schedsim


def test_between_and_within_from_known_speeds():
    # Three rounds at 1.0, 1.1, 0.9 ms with windows alternating +-5% within each.
    rounds = []
    for base in (1.0, 1.1, 0.9):
        starts = np.arange(0, 1.0, 0.001)
        factor = np.where((starts // 0.25) % 2 == 0, 0.95, 1.05)
        rounds.append((starts, base * factor * 1e-3))
    rec = summarise(rounds, 0.25)
    medians = np.array([r[1].mean() for r in rounds])   # each round's median: between 0.95x and 1.05x
    assert rec["rounds"] == 3 and rec["windows"] == 12
    assert rec["between_runs_cv"] == pytest.approx(np.std([1.0, 1.1, 0.9], ddof=1) / 1.0, rel=0.05)
    ratios = np.array([0.95, 1.05] * 6) / 1.0
    assert rec["within_run_cv"] == pytest.approx(np.std(ratios / np.median(ratios), ddof=1), rel=0.05)
    assert medians.size == 3 and "method" in rec and "scope" in rec


def test_the_timeline_counts_stalls_that_medians_leave_out():
    """One round with a 40 ms stall in its second window: the medians do not see it, the
    timeline's window and round factors do (a queue waits for the whole stall)."""
    rounds = []
    for stall in (False, True, False):
        starts = np.arange(0, 1.0, 0.001)
        durations = np.full(starts.size, 1e-3)
        if stall:
            durations[300] = 40e-3
        rounds.append((starts, durations))
    rec = summarise(rounds, 0.25)
    assert rec["between_runs_cv"] == 0 and rec["within_run_cv"] == 0
    assert [len(w) for w in rec["window_factors"]] == [4, 4, 4]
    stalled = np.asarray(rec["window_factors"][1])
    # Round mean (999 x 1 + 40) / 1000 = 1.039 ms; the stalled window (249 x 1 + 40) / 250 = 1.156 ms.
    assert stalled[1] == pytest.approx(1.156 / 1.039, rel=1e-4)
    assert stalled[[0, 2, 3]] == pytest.approx(1 / 1.039, rel=1e-4)
    assert rec["round_factors"][1] > 1.0 > rec["round_factors"][0]
    assert rec["round_means_ms"][1] == pytest.approx(1.039, rel=1e-6)
    assert rec["reference_ms"] == pytest.approx((1 + 1.039 + 1) / 3, rel=1e-6)
    assert rec["between_runs_cv_mean"] > 0.01 and rec["within_run_cv_mean"] > 0.01


def test_a_record_from_served_batches_is_in_table_units():
    """Two live runs' batches: one at the table's speed, one 1.5x slower with a 3x window."""
    t = np.arange(0.0, 1.0, 0.01)
    slow = np.where((t >= 0.25) & (t < 0.5), 3.0, 1.0)
    rec = from_batches([(t + 5.0, np.ones_like(t)), (t, slow)], 0.25)
    assert rec["reference_ms"] == 1.0 and rec["reference"].startswith("the cost table")
    assert rec["round_factors"] == pytest.approx([1.0, 1.5])
    assert rec["window_factors"][1] == pytest.approx([1 / 1.5, 2.0, 1 / 1.5, 1 / 1.5], rel=1e-4)
    assert rec["window_factors"][0] == pytest.approx([1.0] * 4) and "from_batches" in rec["method"]


def test_measure_times_each_call_with_the_given_clock():
    t = {"now": 0.0}
    speeds = iter([1e-3] * 100000)

    def call():
        t["now"] += next(speeds)

    rec = measure(call, rounds=3, round_s=0.5, window_s=0.1, pause_s=0.2, clock=lambda: t["now"],
                  sleep=lambda s: t.__setitem__("now", t["now"] + s))
    assert rec["between_runs_cv"] == pytest.approx(0.0, abs=1e-9)
    assert rec["within_run_cv"] == pytest.approx(0.0, abs=1e-9)
    assert rec["round_medians_ms"] == pytest.approx([1.0, 1.0, 1.0])
    reported = measure(lambda: 0.002, rounds=2, round_s=0.01, window_s=0.01, pause_s=0.0)
    assert reported["round_medians_ms"] == pytest.approx([2.0, 2.0]) and "warning" in reported


def test_bad_settings_and_combining():
    with pytest.raises(InputError, match="rounds"):
        measure(lambda: 0.001, rounds=1)
    with pytest.raises(InputError, match="window_s"):
        measure(lambda: 0.001, round_s=0.1, window_s=0.2)
    a = {"round_medians_ms": [1.0, 1.02], "within_run_cv": 0.03, "window_s": 0.25, "windows": 8}
    b = {"round_medians_ms": [1.2, 1.22], "within_run_cv": 0.04, "window_s": 0.25, "windows": 8}
    both = combine([a, b])
    assert both["between_runs_cv"] == pytest.approx(np.std([1.0, 1.02, 1.2, 1.22], ddof=1) / 1.11)
    assert both["within_run_cv"] == pytest.approx(np.sqrt((0.03**2 + 0.04**2) / 2))
    with pytest.raises(InputError, match="window_s"):
        combine([a, dict(b, window_s=1.0)])
    assert "window_factors" not in both   # records without a timeline combine without one
    ta = a | {"round_means_ms": [1.0, 1.1], "window_factors": [[1.0, 1.0], [0.9, 1.1]]}
    tb = b | {"round_means_ms": [1.3], "window_factors": [[1.2, 0.8]]}
    pooled = combine([ta, tb])
    assert pooled["window_factors"] == [[1.0, 1.0], [0.9, 1.1], [1.2, 0.8]]
    assert pooled["between_runs_cv_mean"] == pytest.approx(np.std([1.0, 1.1, 1.3], ddof=1) / np.mean([1.0, 1.1, 1.3]))
    # Relative to the first record's host (the profile's own): its rounds' mean, 1.05 ms.
    assert pooled["reference_ms"] == pytest.approx(1.05)
    # Over the table's own mean for the call: how much slower than the table the host ran.
    table = relative_to(ta, 0.8, "the table's mean at batch 1")
    assert table["round_factors"] == pytest.approx([1.25, 1.375]) and table["reference"].startswith("the table")
    assert combine([table, tb])["round_factors"] == pytest.approx([1.25, 1.375, 1.625])
    with pytest.raises(InputError, match="reference"):
        relative_to(ta, 0.0, "nothing")
    assert pooled["round_factors"] == pytest.approx(np.array([1.0, 1.1, 1.3]) / 1.05, abs=1e-5)


def test_a_host_variation_record_widens_the_runs_band(tmp_path):
    src = default_profile_path()
    for f in src.parent.glob(src.stem + ".*"):
        shutil.copy(f, tmp_path / f.name)
    side = tmp_path / (src.stem + ".json")
    meta = json.loads(side.read_text())
    trace = tmp_path / "t.csv"
    trace.write_text("".join((ROOT / "traces" / "poisson_2000rps.csv").read_text().splitlines(keepends=True)[:3001]))
    plain = execute(RunSpec(trace=trace, profile=tmp_path / src.name)).summary
    side.write_text(json.dumps(meta | {"host_variation": {"between_runs_cv": 0.05, "within_run_cv": 0.1,
                                                          "window_s": 0.25}}))
    hosty = execute(RunSpec(trace=trace, profile=tmp_path / src.name)).summary
    assert hosty["p99_ms"] == plain["p99_ms"]   # the point estimate does not move
    width = lambda s: s["p99_ms_hi"] - s["p99_ms_lo"]  # noqa: E731
    assert width(hosty) > 2 * width(plain)
    assert hosty["band"]["host_sigma"] > 0.05 and any("host speed" in x for x in hosty["band"]["sources"])


def _table_columns(path, *names):
    import pandas as pd

    table = pd.read_csv(path)
    return [table[n].tolist() for n in names]


def test_profile_records_host_variation_on_a_cpu_engine(tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "p.csv"
    proc = schedsim("profile", "--backend", "onnxruntime", "--model", "builtin:bert-tiny", "--batch-sizes", "1,2",
                    "--seq-lens", "16", "--min-time-s", "0.1", "--warmup-ms", "10", "--dispatch-iters", "0",
                    "--host-variation-s", "0.2", "--out", out)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.with_suffix(".json").read_text())["host_variation"]
    assert rec["rounds"] == 5 and rec["calls"] > 5 and rec["between_runs_cv"] >= 0 and rec["within_run_cv"] >= 0
    assert rec["window_s"] == pytest.approx(0.05) and "batch of 1" in rec["call"]
    assert len(rec["window_factors"]) == 5 and len(rec["round_factors"]) == 5 and rec["within_run_cv_mean"] >= 0
    table = json.loads(out.with_suffix(".json").read_text())
    rows = {int(b): m for b, m in zip(*_table_columns(out, "batch", "latency_ms_mean"))}
    assert rec["reference_ms"] == pytest.approx(rows[1]) and "batch 1" in rec["reference"]
    assert rec["round_factors"] == pytest.approx(np.asarray(rec["round_means_ms"]) / rows[1], rel=1e-4)
    assert table["host_variation"] == rec
    bad = schedsim("profile", "--backend", "onnxruntime", "--model", "builtin:bert-tiny", "--host-variation-s", "-1",
                   "--out", tmp_path / "q.csv")
    assert bad.returncode == 2 and "--host-variation-s" in bad.stderr
