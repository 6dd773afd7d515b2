"""The calibration fits behind the default profile's sidecar (experiments/fidelity/):
the dispatch line from busy launches and the wake-up extras over it, on synthetic
batches.csv files whose answer is known; and the live-vs-live comparison."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

HERE = Path(__file__).resolve().parents[2] / "experiments" / "fidelity"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def batches_csv(path: Path, rows: list[dict]) -> Path:
    """rows: trigger, samples, gap_us, idle_us (before the trigger), service_ms."""
    out, t = [], 1.0
    for i, r in enumerate(rows):
        trigger_s = t + r.get("idle_us", 0.0) / 1e6
        issue_s = trigger_s + r["gap_us"] / 1e6
        done_s = issue_s + r["service_ms"] / 1e3
        out.append({"batch": i, "instance": 0, "requests": r["samples"], "samples": r["samples"], "seq_len": 128,
                    "trigger": r["trigger"], "trigger_s": trigger_s, "decide_s": trigger_s, "issue_s": issue_s,
                    "done_s": done_s, "dispatch_us": r["gap_us"], "gap_us": r["gap_us"],
                    "host_ms": r["service_ms"], "gpu_ms": r["service_ms"], "status": "ok", "error": ""})
        t = done_s
    pd.DataFrame(out).to_csv(path, index=False)
    return path


def test_dispatch_line_is_fitted_on_busy_launches_only(tmp_path):
    fit = load("fit_wake_curve")
    rng = np.random.default_rng(0)
    rows = [{"trigger": "completion", "samples": 1, "gap_us": 500.0, "service_ms": 1.0}]  # follows a start: not busy
    for _ in range(400):
        b = int(rng.integers(1, 65))
        rows.append({"trigger": "completion", "samples": b, "gap_us": 40.0 + 0.8 * (b - 1), "service_ms": 1.0})
    rows += [{"trigger": "arrival", "samples": 3, "gap_us": 900.0, "idle_us": 5000.0, "service_ms": 1.0},
             {"trigger": "completion", "samples": 3, "gap_us": 700.0, "service_ms": 1.0}]  # after a wake: not busy
    busy = fit.busy_launches([batches_csv(tmp_path / "loop.csv", rows)], skip_s=0.0)
    assert len(busy) == 400    # the first launch and the one after the wake are left out
    line = fit.fit_dispatch(busy)
    assert line["dispatch_overhead_us"] == pytest.approx(40.0, abs=1e-6)
    assert line["dispatch_overhead_us_per_sample"] == pytest.approx(0.8, abs=1e-6)


def test_wake_extras_are_measured_over_the_dispatch_line(tmp_path):
    fit = load("fit_wake_curve")
    mean_ms = pd.Series({b: 1.0 for b in range(1, 65)})
    rows = []
    for idle_us, extra_us in ((100.0, 120.0), (3000.0, 230.0)):
        for b in (1, 33):
            rows.append({"trigger": "arrival", "samples": b, "idle_us": idle_us,
                         "gap_us": 40.0 + 0.8 * (b - 1) + extra_us, "service_ms": 1.0})
    launches = fit.wake_launches([batches_csv(tmp_path / "light.csv", rows)], mean_ms, 40.0, skip_s=0.0,
                                 per_sample_us=0.8)
    got = launches.groupby(launches.idle_us.round(-2)).extra_us.agg(["min", "max"])
    np.testing.assert_allclose(got.loc[100.0].to_numpy(), 120.0, atol=1e-6)
    np.testing.assert_allclose(got.loc[3000.0].to_numpy(), 230.0, atol=1e-6)


def test_compare_live_runs_reports_each_cells_spread(tmp_path):
    cmp = load("compare_live_runs")
    cols = ["cell", "profile", "instances", "p99_measured"]
    a = pd.DataFrame([["x", "a", 1, 2.0], ["x", "e", 1, 2.0], ["y", "a", 2, 4.0]], columns=cols)
    b = pd.DataFrame([["x", "a", 1, 2.5], ["y", "a", 2, 3.0], ["z", "a", 1, 1.0]], columns=cols)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    assert cmp.main([str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--out", str(tmp_path / "o.csv")]) == 0
    out = pd.read_csv(tmp_path / "o.csv").set_index("cell")
    assert sorted(out.index) == ["x", "y"]     # z ran once
    assert out.loc["x", "max_diff_pct"] == pytest.approx(25.0)
    assert out.loc["y", "max_diff_pct"] == pytest.approx(25.0)
    assert out.loc["x", "runs"] == 2


def test_pooled_compares_the_prediction_with_the_median_of_the_live_runs():
    pooled = load("pooled").pooled

    def table(measured: dict, predicted=2.0):
        return pd.DataFrame({"cell": list(measured), "instances": [2 if "2inst" in c else 1 for c in measured],
                             "p99_predicted": predicted, "p99_measured": list(measured.values())})

    runs = {"a": table({"x": 1.0, "y-2inst": 4.0}), "b": table({"x": 2.5, "y-2inst": 9.0}),
            "c": table({"x": 2.2, "y-2inst": 5.0})}
    out = pooled(runs, exclude_two_instance={"b"})
    assert out.loc["x", "runs"] == 3 and out.loc["x", "p99_live_median"] == 2.2
    assert out.loc["x", "p99_err_pct"] == pytest.approx((2.0 / 2.2 - 1) * 100)
    assert out.loc["x", "within_live_range"]
    # Leave one out: 1.0 against 2.35 (-57.4%), 2.5 against 1.6 (+56.25%), 2.2 against 1.75 (+25.7%).
    assert out.loc["x", "live_loo_median_pct"] == pytest.approx(56.25)
    assert out.loc["x", "live_loo_worst_pct"] == pytest.approx((1 - 1.0 / 2.35) * 100)
    # Run b's two-instance cell is left out: the median of 4 and 5.
    assert out.loc["y-2inst", "runs"] == 2 and out.loc["y-2inst", "p99_live_median"] == 4.5
    assert not out.loc["y-2inst", "within_live_range"]
    # A cell seen in one run only has no median to speak of.
    assert "z" not in pooled({"a": table({"z": 1.0}), "b": table({"x": 1.0})}).index
