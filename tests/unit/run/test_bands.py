"""Prediction bands (schedsim.run.bands): their edges, their coverage of the simulator's own
independent runs, how their width follows trace length, and the point estimate they leave alone."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from schedsim.core.metrics import summarize
from schedsim.core.policy import Requests
from schedsim.core.simulate import simulate
from schedsim.cost.model import CostModel
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.errors import InputError
from schedsim.registry import build_policy
from schedsim.run import bands
from schedsim.run.runner import execute
from schedsim.run.spec import RunInputs, RunSpec
from schedsim.traces.generate import generate
from schedsim.traces.io import save_trace

COST = CostModel.from_profile(load_profile(default_profile_path()))
SERVICE_1_S = COST.mean_s(1) + COST.dispatch_s(1)


def test_least_replications_and_edges_are_order_statistics():
    assert bands.least_replications(0.9) == 19
    assert bands.least_replications(0.8) == 9
    values = np.arange(1.0, 20.0)  # 19 values
    assert bands.band_edges(values, 0.9) == (1.0, 19.0)
    assert bands.band_edges(np.arange(1.0, 40.0), 0.9) == pytest.approx((2.0, 38.0))
    assert all(math.isnan(v) for v in bands.band_edges([1.0, np.nan], 0.9))


def test_plan_defaults_levels_and_bad_values():
    plan, note = bands.plan_band(None, 1000)
    assert (plan.level, plan.replications, plan.arrivals, note) == (0.9, 19, "fixed", None)
    plan, note = bands.plan_band(None, bands.AUTO_MAX_REQUESTS + 1)
    assert plan is None and "--band 0.9" in note
    assert bands.plan_band(0.9, bands.AUTO_MAX_REQUESTS + 1)[0].replications == 19
    assert bands.plan_band(0, 10) == (None, None)
    assert bands.plan_band(0.95, 10)[0].replications == 39
    for level in (1.0, -0.1, 1.5):
        with pytest.raises(InputError, match="--band"):
            bands.plan_band(level, 10)
    with pytest.raises(InputError, match="--band-replications: 9 cannot give a 90% band"):
        bands.plan_band(0.9, 10, replications=9)
    with pytest.raises(InputError, match="--band-arrivals"):
        bands.plan_band(0.9, 10, arrivals="poisson")


def _poisson(n: int, rate: float, seed: int):
    return generate("poisson", rng=np.random.default_rng(seed), n=n, rate=rate)


def _summary(trace, seed: int, policy: str = "dynamic", cost=COST) -> dict:
    return summarize(simulate(Requests.from_trace(trace), build_policy(policy, {}), cost, seed=seed))


def test_band_covers_the_simulators_own_independent_runs_90_percent_of_the_time():
    """Simulated "live" runs of a known model (service-time draws with seeds the band never
    uses) land inside the 90% band between 85% and 95% of the time, for p50, p99 and the mean."""
    trace = _poisson(400, 0.7 / SERVICE_1_S, seed=5)
    plan = bands.BandPlan(0.9, 19)
    one = lambda seed, factor, rng: _summary(trace, seed)  # noqa: E731
    keys = ("p50_ms", "p99_ms", "mean_ms")
    inside = {k: [] for k in keys}
    for b in range(12):
        band = bands.compute_band(plan, 10_000 + b, one, keys)
        for live_seed in range(20):
            live = _summary(trace, 1_000_000 + 100 * b + live_seed)
            for k in keys:
                inside[k].append(band[f"{k}_lo"] <= live[k] <= band[f"{k}_hi"])
    for k in keys:
        assert 0.85 <= np.mean(inside[k]) <= 0.95, (k, np.mean(inside[k]))


def test_band_with_arrival_draws_covers_fresh_traces_of_the_same_process():
    """Each replication a fresh Poisson trace of the same length (arrival and service draws
    independent): a fresh trace's figures land inside 85-95% of the time."""
    n, rate = 300, 0.6 / SERVICE_1_S
    plan = bands.BandPlan(0.9, 19)

    def one(seed, factor, rng):
        return _summary(_poisson(n, rate, seed), seed)

    inside = []
    for b in range(12):
        band = bands.compute_band(plan, 20_000 + b, one, ("p99_ms", "mean_ms"))
        for live_seed in range(20):
            s = 5_000_000 + 100 * b + live_seed
            live = _summary(_poisson(n, rate, s), s)
            inside += [band[f"{k}_lo"] <= live[k] <= band[f"{k}_hi"] for k in ("p99_ms", "mean_ms")]
    assert 0.85 <= np.mean(inside) <= 0.95, np.mean(inside)


def test_band_width_of_the_mean_follows_one_over_root_n():
    """No batching at 5% load: requests hardly queue, so with the arrivals fixed a run's mean
    latency is a fixed part plus the mean of n independent draws, and its 90% band is
    2 x 1.645 sigma / sqrt(n), sigma the spread of one request's latency given its arrival
    (std of the difference of two seeds' latencies, request by request, over sqrt 2, on a
    long trace). 16x the requests: a quarter the width."""
    plan = bands.BandPlan(0.9, 59)
    long = Requests.from_trace(_poisson(20_000, 0.05 / SERVICE_1_S, seed=8))
    runs = [simulate(long, build_policy("none", {}), COST, seed=s) for s in (1, 2)]
    sigma_ms = float(np.std((runs[0].end_ns - runs[1].end_ns) / 1e6)) / math.sqrt(2)
    widths = {}
    for n in (300, 4800):
        trace = _poisson(n, 0.05 / SERVICE_1_S, seed=7)
        band = bands.compute_band(plan, 3, lambda seed, f, rng: _summary(trace, seed, "none"), ("mean_ms",))
        widths[n] = band["mean_ms_hi"] - band["mean_ms_lo"]
        theory = 2 * 1.6449 * sigma_ms / math.sqrt(n)
        assert widths[n] == pytest.approx(theory, rel=0.35), (n, widths[n], theory)
    assert widths[300] / widths[4800] == pytest.approx(4.0, rel=0.3)


def test_host_sigma_from_the_sidecar_record():
    assert bands.host_sigma({}, 10.0) == 0.0
    rec = {"host_variation": {"between_runs_cv": 0.05, "within_run_cv": 0.2, "window_s": 1.0}}
    short, long = bands.host_sigma(rec, 1.0), bands.host_sigma(rec, 100.0)
    assert short == pytest.approx(math.sqrt(math.log1p(0.05**2) + math.log1p(0.2**2)))
    assert long == pytest.approx(math.sqrt(math.log1p(0.05**2) + math.log1p(0.2**2) / 100))
    assert short > long > bands.host_sigma({"host_variation": {"between_runs_cv": 0.05}}, 1.0) * 0.999


def test_scaled_cost_is_the_same_model_on_a_slower_host():
    slow = bands.scaled_cost(COST, 1.25)
    for b in (1, 8, 64):
        assert slow.mean_s(b) == pytest.approx(1.25 * COST.mean_s(b), rel=1e-9)
        assert slow.dispatch_s(b) == pytest.approx(1.25 * COST.dispatch_s(b), rel=1e-9)
    u = np.random.default_rng(0)
    assert slow.sample_s(4, 0, np.random.default_rng(1)) == pytest.approx(
        1.25 * COST.sample_s(4, 0, np.random.default_rng(1)), rel=1e-9)
    assert u is not None


def test_host_variation_widens_the_band():
    trace = _poisson(400, 0.5 / SERVICE_1_S, seed=3)
    plan = bands.BandPlan(0.9, 19)

    def one(seed, factor, rng):
        return _summary(trace, seed, cost=COST if factor == 1.0 else bands.scaled_cost(COST, factor))

    plain = bands.compute_band(plan, 1, one, ("p99_ms",))
    hosty = bands.compute_band(plan, 1, one, ("p99_ms",), sigma=0.1)
    assert hosty["p99_ms_hi"] - hosty["p99_ms_lo"] > 1.5 * (plain["p99_ms_hi"] - plain["p99_ms_lo"])
    assert "host speed" in " ".join(hosty["band"]["sources"])


_ROUNDS = [[1.0, 1.0, 0.9, 1.6, 1.7, 1.0, 0.8, 0.9], [0.9, 1.0, 1.0, 1.0, 1.1, 0.9, 1.0, 1.0],
           [1.5, 1.6, 1.4, 0.9, 0.8, 0.9, 1.0, 0.9], [1.0, 0.9, 1.0, 1.1, 1.0, 0.9, 1.0, 1.1],
           [0.8, 0.9, 0.9, 1.0, 1.0, 1.9, 1.2, 0.9]]
"""Window factors with slow spells of 2-3 windows, as a shared CPU host shows them."""
TIMELINE = {"between_runs_cv": 0.02, "within_run_cv": 0.05, "window_s": 0.05, "window_factors": _ROUNDS,
            "round_factors": [1.0, 0.9, 1.1, 1.2, 0.8]}


def _timeline_cost(record=TIMELINE, cost=COST):
    return CostModel.from_profile(dataclasses.replace(cost.profile, meta=cost.profile.meta | {"host_variation": record}))


def test_a_host_path_runs_the_trace_on_host_time():
    """On a host twice as slow throughout, a wake-free run at light load takes twice as long
    per request; times map back exactly."""
    plain = CostModel.from_profile(COST.profile, wake_overhead_s=0.0)
    trace = _poisson(2000, 0.02 / SERVICE_1_S, seed=1)
    req = Requests.from_trace(trace)
    path = bands.HostPath(int(req.arrival_ns[0]), 0.25, np.full(4 * 200, 2.0))
    moved = dataclasses.replace(trace, arrival_s=path.to_host(req.arrival_ns) / 1e9)
    slow = bands.on_host_path(simulate(Requests.from_trace(moved), build_policy("none", {}), plain, seed=3), req, path)
    base = simulate(req, build_policy("none", {}), plain, seed=3)
    assert slow.requests is req
    # Request by request, except the few that now queue behind a (twice as long) batch.
    twice = np.isclose(slow.end_ns - req.arrival_ns, 2 * (base.end_ns - req.arrival_ns), rtol=1e-4, atol=0)
    assert twice.mean() > 0.95
    t = np.array([0, 10**8, 3 * 10**8 + 7, 10**12])
    assert np.abs(path.to_wall(path.to_host(t)) - t).max() <= 2   # ns: each way rounds to the ns
    assert path.to_wall(np.array([-1]))[0] == -1


def test_timeline_from_the_record_and_its_paths():
    assert bands.HostTimeline.from_meta({}) is None
    assert bands.HostTimeline.from_meta({"host_variation": {"between_runs_cv": 0.1}}) is None
    timeline = bands.HostTimeline.from_meta({"host_variation": TIMELINE})
    assert timeline.windows == 40 and "5 measured rounds" in timeline.describe()
    a = timeline.draw(np.random.default_rng(4), 0, 3.0)
    b = timeline.draw(np.random.default_rng(4), 0, 3.0)
    assert np.array_equal(a.slowdown, b.slowdown) and a.slowdown.size == 2 * 3.0 / 0.05 + 1
    # From a random window on: the rounds in their measured order, each at its level.
    levels = [np.asarray(r) * f for r, f in zip(_ROUNDS, TIMELINE["round_factors"])]
    whole = np.concatenate(levels * 4)
    assert any(np.allclose(whole[k:k + a.slowdown.size], a.slowdown) for k in range(40))
    with pytest.raises(InputError, match="window_factors"):
        bands.HostTimeline.from_meta({"host_variation": TIMELINE | {"window_factors": [[1.0, -1.0]]} |
                                      {"round_factors": [1.0]}})
    with pytest.raises(InputError, match="round_factors"):
        bands.HostTimeline.from_meta({"host_variation": TIMELINE | {"round_factors": [1.0]}})
    assert bands.host_sigma({"host_variation": TIMELINE}, 1.0, timeline=True) == 0.0
    assert bands.host_sigma({"host_variation": TIMELINE}, 1.0) == \
        pytest.approx(math.sqrt(math.log1p(0.02**2) + math.log1p(0.05**2) * 0.05))   # without: as before


def test_a_timeline_of_servers_keeps_each_path_on_one_server():
    """Rounds measured on fresh servers (rounds_are: servers): a path cycles through its own
    server's windows, at that server's level, never into the next server's."""
    timeline = bands.HostTimeline.from_meta({"host_variation": TIMELINE | {"rounds_are": "servers"}})
    levels = [np.asarray(r) * f for r, f in zip(_ROUNDS, TIMELINE["round_factors"])]
    for seed in range(20):
        path = timeline.draw(np.random.default_rng(seed), 0, 3.0)
        assert any(np.allclose(path.slowdown, np.concatenate([lv] * 200)[k:k + path.slowdown.size])
                   for lv in levels for k in range(lv.size)), seed


def test_band_on_a_host_timeline_covers_the_simulators_own_runs_90_percent_of_the_time():
    """The band with the host's timeline against simulated "live" runs of the same model:
    service times and the host's path (its level and its slow spells) drawn with seeds the
    band never uses. At 70% load the slow spells build queues, so p99 moves by tens of percent
    from run to run; the band still covers 85-95% of the runs."""
    cost = _timeline_cost()
    trace = _poisson(400, 0.7 / SERVICE_1_S, seed=5)
    spec = RunSpec(trace=Path("unused.csv"), policy="dynamic")
    inputs = RunInputs(trace, Requests.from_trace(trace), build_policy("dynamic", {}), {}, 1)
    one = bands.request_level_one(spec, inputs, cost)
    assert bands.host_sigma(cost.profile.meta, bands.trace_duration_s(trace), timeline=True) == 0
    plan = bands.BandPlan(0.9, 19)
    keys = ("p50_ms", "p99_ms", "mean_ms")
    inside = {k: [] for k in keys}
    spread = []
    for b in range(40):   # many bands, few runs each: each band's own coverage varies (sd 0.065)
        band = bands.compute_band(plan, 30_000 + b, one, keys)
        for live_seed in range(10):
            live = one(2_000_000 + 100 * b + live_seed, 1.0, None)
            spread.append(live["p99_ms"])
            for k in keys:
                inside[k].append(band[f"{k}_lo"] <= live[k] <= band[f"{k}_hi"])
    assert any("measured rounds" in x for x in band["band"]["sources"])
    assert np.std(spread) / np.mean(spread) > 0.1
    for k in keys:
        assert 0.85 <= np.mean(inside[k]) <= 0.95, (k, np.mean(inside[k]))


def test_resampled_arrivals_keep_length_first_arrival_and_gaps():
    trace = _poisson(500, 100.0, seed=1)
    again = bands.resample_arrivals(trace, np.random.default_rng(2))
    assert len(again.arrival_s) == 500 and again.arrival_s[0] == trace.arrival_s[0]
    assert np.all(np.diff(again.arrival_s) >= 0)
    assert set(np.round(np.diff(again.arrival_s), 12)) <= set(np.round(np.diff(trace.arrival_s), 12))


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    return save_trace(_poisson(2000, 1500.0, seed=11), tmp_path_factory.mktemp("bands") / "t.csv")


def test_run_reports_edges_and_leaves_the_point_estimate_bit_for_bit(trace_file):
    plain = execute(RunSpec(trace=trace_file, band=0)).summary
    banded = execute(RunSpec(trace=trace_file)).summary
    assert "p99_ms_lo" not in plain and "band" not in plain
    for key in bands.REQUEST_KEYS:
        assert banded[key] == plain[key]
        assert banded[f"{key}_lo"] <= banded[f"{key}_hi"]
    assert banded["band"]["level"] == 0.9 and banded["band"]["replications"] == 19
    assert "order statistics" in banded["band"]["method"]
    # The bundled profile has no host record: the band says what it leaves out.
    assert banded["band"]["absent"] == [bands.NO_HOST_RECORD]
    assert f"not in the band: {bands.NO_HOST_RECORD}" in bands.band_text(banded)
    again = execute(RunSpec(trace=trace_file)).summary
    assert {k: again[k] for k in again if k.endswith(("_lo", "_hi"))} == \
        {k: banded[k] for k in banded if k.endswith(("_lo", "_hi"))}


def test_a_profile_with_a_host_record_leaves_nothing_out(trace_file, tmp_path):
    import json
    import shutil

    src = default_profile_path()
    for sibling in src.parent.glob(src.stem + ".*"):
        shutil.copy(sibling, tmp_path / sibling.name)
    profile = tmp_path / src.name
    meta = json.loads(src.with_suffix(".json").read_text())
    meta["host_variation"] = TIMELINE
    (tmp_path / src.with_suffix(".json").name).write_text(json.dumps(meta))
    band = execute(RunSpec(trace=trace_file, profile=profile)).summary["band"]
    assert "absent" not in band and any(s.startswith("the host's measured speed") for s in band["sources"])


def test_run_with_replications_keeps_its_means_and_adds_the_band(trace_file):
    plain = execute(RunSpec(trace=trace_file, replications=3, band=0)).summary
    banded = execute(RunSpec(trace=trace_file, replications=3, band=0.8, band_replications=9)).summary
    assert banded["p99_ms"] == plain["p99_ms"] and banded["p99_ms_ci"] == plain["p99_ms_ci"]
    assert banded["band"]["replications"] == 9 and banded["band"]["level"] == 0.8


def test_plots_shade_the_bands(tmp_path):
    import matplotlib.pyplot as plt

    from schedsim.run.plots import draw_band

    fig, ax = plt.subplots()
    draw_band(ax, {"p50_ms": 1.0, "p50_ms_lo": 0.9, "p50_ms_hi": 1.1, "p99_ms": 3.0, "p99_ms_lo": 2.5,
                   "p99_ms_hi": 3.5, "band": {"level": 0.9, "replications": 19}}, ("p50_ms", "p99_ms"))
    spans = [p for p in ax.patches]
    assert len(spans) == 2 and "90% band" in ax.get_legend().get_texts()[0].get_text()
    fig2, ax2 = plt.subplots()
    draw_band(ax2, {"p99_ms": 3.0}, ("p99_ms",))
    assert not ax2.patches and ax2.get_legend() is None
    plt.close(fig), plt.close(fig2)
