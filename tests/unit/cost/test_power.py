"""The power cap's clock: steady factors by batch size, relaxation in time, validation, and
the driver pricing each batch at the clock its predecessors left."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from policies import NoBatching, StaticBatching
from schedsim.cost.model import CostModel
from schedsim.errors import InputError
from schedsim.core.policy import Requests
from schedsim.cost.power import GpuClock, PowerCap, replay
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.cost.protocols import BatchCost
from schedsim.core.simulate import simulate
from schedsim.traces.table import Trace


def cap(**kw):
    args = dict(batch=[8, 64], factor=[0.99, 1.05], tau_rise_ms=20.0, tau_fall_ms=10.0) | kw
    return PowerCap(args.pop("batch"), args.pop("factor"), **args)


def test_steady_factor_interpolates_in_batch_size_and_is_flat_beyond_the_ends():
    c = cap()
    assert c.steady(1) == 0.99 and c.steady(8) == 0.99
    assert c.steady(36) == pytest.approx(1.02)
    assert c.steady(64) == 1.05 and c.steady(128) == 1.05
    assert c.idle_factor == 0.99


def test_the_clock_relaxes_toward_the_running_batch_then_toward_idle():
    clock = GpuClock(cap())
    assert clock.launch(0, 64) == 0.99            # a trace starts on an idle GPU
    clock.ran(20_000_000)                          # 20 ms of batch 64: one rise time constant
    f = clock.launch(20_000_000, 64)
    assert f == pytest.approx(1.05 - 0.06 * math.exp(-1.0))
    clock.ran(30_000_000)
    # Idle from 30 ms to 40 ms: one fall time constant toward 0.99.
    at_30 = 1.05 + (f - 1.05) * math.exp(-0.5)
    assert clock.launch(40_000_000, 8) == pytest.approx(0.99 + (at_30 - 0.99) * math.exp(-1.0))


@given(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 5_000_000), st.integers(0, 5_000_000)),
                min_size=1, max_size=60))
def test_the_factor_stays_between_the_smallest_and_largest_steady_factor(batches):
    c, clock, now = cap(), GpuClock(cap()), 0
    for samples, duration, gap in batches:
        f = clock.launch(now, samples)
        assert c.idle_factor - 1e-12 <= f <= max(c.factor) + 1e-12
        clock.ran(now + duration)
        now += duration + gap


@pytest.mark.parametrize("kw, what", [
    (dict(batch=[], factor=[]), "non-empty"),
    (dict(factor=[1.0, "fast"]), "lists of numbers"),
    (dict(batch=[8, 8], factor=[1, 1]), "strictly increasing"),
    (dict(factor=[1.0, 0.0]), "factor must be"),
    (dict(tau_rise_ms=0), "tau_rise_ms"),
    (dict(tau_fall_ms=None), "tau_fall_ms"),
])
def test_bad_caps_are_refused_with_the_field_named(kw, what):
    with pytest.raises(InputError, match=what):
        cap(**kw)


class _FixedCost(BatchCost):
    """1 ms per batch plus 0.1 ms dispatch, whatever the size; the power cap of ``cap()``."""

    power_cap = cap(tau_rise_ms=1e-6, tau_fall_ms=1e-6)   # the clock jumps to each target

    def sample_s(self, samples, seq_len, rng):
        return 0.0011

    def dispatch_s(self, samples):
        return 0.0001


def test_the_driver_scales_the_time_past_dispatch_by_the_clock_at_launch():
    # Static batches of 64 back to back: the first launches on an idle GPU (0.99); every later
    # one on a GPU that ran 64s until that instant (1.05).
    req = Requests.from_trace(Trace.from_arrivals(np.zeros(64 * 3)))
    result = simulate(req, StaticBatching(batch_size=64), _FixedCost())
    durations = (result.batch_end_ns - result.batch_start_ns).tolist()
    assert durations == [round((0.0001 + 0.001 * 0.99) * 1e9)] + [round((0.0001 + 0.001 * 1.05) * 1e9)] * 2


def test_the_default_profile_carries_its_measured_cap_and_no_power_cap_turns_it_off():
    profile = load_profile(default_profile_path())
    assert set(profile.meta["power_cap"]) >= {"batch", "factor", "tau_rise_ms", "tau_fall_ms", "source"}
    on, off = CostModel.from_profile(profile), CostModel.from_profile(profile, power_cap=False)
    assert on.power_cap is not None and off.power_cap is None
    # Saturated: back-to-back batches of 64 run slower under the cap than the table's loop.
    req = Requests.from_trace(Trace.from_arrivals(np.zeros(64 * 40), seq_len=[128] * (64 * 40)))
    slow, flat = (simulate(req, StaticBatching(batch_size=64), c, seed=3) for c in (on, off))
    ratio = (slow.batch_end_ns - slow.batch_start_ns)[-10:].sum() / (flat.batch_end_ns - flat.batch_start_ns)[-10:].sum()
    assert 1.02 < ratio < 1.06
    # Light load: one request at a time on an idle GPU runs at the uncapped clock, a little faster.
    light = Requests.from_trace(Trace.from_arrivals(np.arange(50) * 0.01, seq_len=[128] * 50))
    a, b = (simulate(light, NoBatching(), c, seed=3) for c in (on, off))
    assert ((a.batch_end_ns - a.batch_start_ns) < (b.batch_end_ns - b.batch_start_ns)).all()


def test_a_malformed_power_cap_in_a_sidecar_is_a_one_line_error(tmp_path):
    src = default_profile_path()
    (tmp_path / "p.csv").write_text(src.read_text())
    meta = json.loads(src.with_suffix(".json").read_text())
    meta["power_cap"] = {"batch": [8, 64], "factor": [1.0], "tau_rise_ms": 20, "tau_fall_ms": 10}
    meta.pop("samples", None)
    (tmp_path / "p.json").write_text(json.dumps(meta))
    (tmp_path / "t.csv").write_text("arrival_s\n0\n0.001\n")
    r = subprocess.run([sys.executable, "-m", "schedsim.cli.main", "run", str(tmp_path / "t.csv"), "--policy", "none",
                        "--profile", str(tmp_path / "p.csv")], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"schedsim: error: {tmp_path / 'p.csv'}: power_cap: batch and factor must be non-empty lists of the same length"]
    r = subprocess.run([sys.executable, "-m", "schedsim.cli.main", "run", str(tmp_path / "t.csv"), "--policy", "none",
                        "--profile", str(tmp_path / "p.csv"), "--no-power-cap", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["power_cap"] is None


def test_a_steady_table_prices_each_entry_at_its_own_state():
    # Each entry measured at its own steady factor: back-to-back batches of one size cost the
    # table's time exactly; a light batch right after heavy ones costs more than its entry.
    steady = cap(table="steady", tau_rise_ms=1e-6, tau_fall_ms=1e-6)
    clock = GpuClock(steady)
    assert clock.launch(0, 8) == pytest.approx(1.0)
    clock.ran(1_000_000)
    assert clock.launch(1_000_000, 64) == pytest.approx(0.99 / 1.05)   # light state, heavy entry
    clock.ran(2_000_000)
    assert clock.launch(2_000_000, 64) == pytest.approx(1.0)
    clock.ran(3_000_000)
    assert clock.launch(3_000_000, 8) == pytest.approx(1.05 / 0.99)
    with pytest.raises(InputError, match="table must be"):
        cap(table="other")


def test_step_tau_recovers_the_time_constant_of_a_clean_step():
    from schedsim.cost.power import step_tau_ms

    t = np.arange(0.0, 300.0, 2.0)
    assert step_tau_ms(t, 1 + (0.95 - 1) * np.exp(-t / 30.0), 0.95) == 30.0


def test_profile_show_prints_the_power_cap():
    r = subprocess.run([sys.executable, "-m", "schedsim.cli.main", "profile", "show", str(default_profile_path())],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "power cap (mix table): after back-to-back batches a batch takes x 0.990 (b8)" in r.stdout


def test_the_clock_predicts_the_live_gpu_slowdown_at_the_same_batch_size():
    """A live run's batches (H200, seven dynamic cells at 75-90% load; tests/data/
    power_cap_check.csv.gz) replayed through the default profile's clock: where the
    model says the GPU is slower, the measured CUDA-event time over the profile's is higher,
    within bands of equal batch size too (so it is not the batch size speaking). Measured:
    Spearman 0.63-0.67 in each band; binned medians 0.978 -> 1.055."""
    import pandas as pd
    from scipy.stats import spearmanr

    root = default_profile_path().parents[1]
    batches = pd.read_csv(root / "tests/data/power_cap_check.csv.gz")
    profile = load_profile(default_profile_path())
    gpu_ms = profile.table.set_index("batch").gpu_ms_mean
    cap = CostModel.from_profile(profile).power_cap
    parts = [g.assign(model=replay(cap, g.issue_s, g.done_s, g.samples), live=g.gpu_ms / g.samples.map(gpu_ms))
             [g.issue_s > 0.5] for _, g in batches.groupby("cell", sort=False)]
    b = pd.concat(parts)
    for lo, hi in ((28, 36), (36, 44), (44, 52)):
        band = b[(b.samples >= lo) & (b.samples < hi)]
        assert spearmanr(band.model, band.live).statistic > 0.4, (lo, hi)
    medians = b.groupby(pd.cut(b.model, [0.98, 0.995, 1.005, 1.015, 1.025, 1.05]), observed=True).live.median()
    assert medians.is_monotonic_increasing and medians.iloc[-1] - medians.iloc[0] > 0.04
