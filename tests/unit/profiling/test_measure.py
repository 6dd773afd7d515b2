"""Timing helpers: statistics against numpy, the unstable flag, interleaved sampling, the GPU sampler."""

import os
import time

import numpy as np
import pytest

from schedsim.profiling import measure
from schedsim.profiling.measure import (UNSTABLE_MAX_OVER_MIN, UNSTABLE_STD_OVER_MEAN, interleaved,
                              machine_metadata, summarize)


def test_summarize_matches_numpy():
    x = np.random.default_rng(1).gamma(20.0, 0.1, size=1000)
    st = summarize(x)
    assert st["n"] == 1000
    assert st["latency_ms_mean"] == pytest.approx(x.mean())
    assert st["latency_ms_std"] == pytest.approx(x.std(ddof=1))
    assert st["latency_ms_p50"] == pytest.approx(np.median(x))
    assert st["latency_ms_p90"] == pytest.approx(np.percentile(x, 90))
    assert st["latency_ms_p99"] == pytest.approx(np.percentile(x, 99))
    assert st["latency_ms_min"] == x.min() and st["latency_ms_max"] == x.max()


def test_summarize_known_values():
    st = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert st["latency_ms_mean"] == 3.0
    assert st["latency_ms_p50"] == 3.0
    assert st["latency_ms_std"] == pytest.approx(np.sqrt(2.5))
    assert st["latency_ms_p90"] == pytest.approx(4.6)


def test_tight_spread_is_stable():
    x = 1.0 + 0.01 * np.random.default_rng(2).standard_normal(500)
    st = summarize(x)
    assert not st["unstable"] and st["unstable_reason"] == ""


def test_wide_std_is_unstable():
    x = np.random.default_rng(3).uniform(1.0, 1.9, size=500)  # max/min < 2, std/mean ~0.18
    st = summarize(x)
    assert st["unstable"] and "std/mean" in st["unstable_reason"]
    assert x.std(ddof=1) / x.mean() > UNSTABLE_STD_OVER_MEAN


def test_single_outlier_trips_max_over_min():
    x = np.full(1000, 1.0)
    x[500] = 2.5  # std/mean stays tiny; only the range gives it away
    st = summarize(x)
    assert st["unstable"] and "max/min" in st["unstable_reason"]
    assert "std/mean" not in st["unstable_reason"]
    assert 2.5 > UNSTABLE_MAX_OVER_MIN


def test_summarize_rejects_empty():
    with pytest.raises(ValueError, match="at least one sample"):
        summarize([])


def _fake_cells(log):
    return {k: (lambda k=k: log.append(k)) for k in ("a", "b", "c", "d")}


def test_interleaved_reaches_min_iters_for_every_cell():
    log = []
    res = interleaved(_fake_cells(log), np.random.default_rng(0), warmup_s=0.0,
                      min_iters=10, min_time_s=0.0, per_visit=3)
    by = res.by_cell()
    assert set(by) == {"a", "b", "c", "d"}
    assert all(len(v) >= 10 for v in by.values())
    assert len(res.order) == len(res.latency_ms) == res.rounds * 4 * 3
    assert all(len(v) == res.rounds * 3 for v in by.values())
    assert np.array_equal(res.samples("a"), by["a"])
    assert (res.latency_ms >= 0).all() and not res.truncated


def test_interleaved_visits_in_rounds_with_per_visit_runs():
    res = interleaved(_fake_cells([]), np.random.default_rng(5), warmup_s=0.0,
                      min_iters=6, min_time_s=0.0, per_visit=2)
    for r in range(res.rounds):
        chunk = res.order[r * 8:(r + 1) * 8]
        assert sorted(set(chunk)) == ["a", "b", "c", "d"]          # every cell once a round
        assert all(chunk[i] == chunk[i + 1] for i in range(0, 8, 2))  # per_visit back to back


def test_interleaved_order_is_deterministic_for_a_seed():
    def order(seed):
        return interleaved(_fake_cells([]), np.random.default_rng(seed), warmup_s=0.0,
                           min_iters=20, min_time_s=0.0, per_visit=1).order

    assert order(7) == order(7)
    assert order(7) != order(8)


def test_interleaved_min_time_and_after_hook():
    seen = []
    res = interleaved(_fake_cells([]), np.random.default_rng(0), warmup_s=0.001,
                      min_iters=1, min_time_s=0.002, per_visit=1, after=seen.append)
    assert res.latency_ms.sum() >= 0.002 * 4 * 1e3
    assert seen == res.order
    assert all(n >= 1 for n in res.warmup_calls.values())


def test_interleaved_max_time_truncates():
    res = interleaved(_fake_cells([]), np.random.default_rng(0), warmup_s=0.0,
                      min_iters=10**9, min_time_s=0.0, max_time_s=0.05)
    assert res.truncated


def test_machine_metadata_never_fails():
    meta = machine_metadata(probe_torch=False)
    for key in ("hostname", "platform", "python", "numpy", "warnings"):
        assert key in meta
    assert isinstance(meta["warnings"], list)


def _fake_smi(tmp_path, monkeypatch):
    """An ``nvidia-smi`` on PATH that prints one CSV line per -lms period, as the real one does."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\nwhile true; do echo '2026/11/30 19:41:41.103, 1980, 3201, 93.25, 44, 0x0'; "
                    "sleep 0.01; done\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")


def test_gpu_sampler_records_while_the_block_runs_and_stops_after(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch)
    out = tmp_path / "smi.csv"
    with measure.gpu_sampler(out, 10) as smi:
        smi.avoid([0])  # moved off CPU 0 where there is another; left where it is where there is not
        deadline = time.monotonic() + 5.0  # 0.3 s is enough on an idle host; a loaded one needs longer
        time.sleep(0.3)
        while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
            time.sleep(0.05)
    assert smi.proc.poll() is not None  # terminated, not left running
    lines = out.read_text().splitlines()
    assert len(lines) >= 3 and lines[0].split(", ")[1] == "1980"
    assert smi.started["interval_ms"] == 10 and smi.started["fields"].startswith("timestamp,")
    size = out.stat().st_size
    time.sleep(0.1)
    assert out.stat().st_size == size


def test_gpu_sampler_is_a_no_op_without_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with measure.gpu_sampler(tmp_path / "smi.csv") as smi:
        smi.avoid([0])
    assert smi.proc is None and smi.started == {} and not (tmp_path / "smi.csv").exists()
