"""Two instances sharing a GPU by both batches' sizes: the pair grid, processor sharing in the
driver, and the sidecar and CLI around them."""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from policies import DynamicBatcher, StaticBatching
from schedsim.core.contention import PairSlowdown, SharedGpu
from schedsim.cost.model import CostModel
from schedsim.errors import InputError
from schedsim.core.policy import Requests
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.core.results import COMPLETED
from schedsim.core.simulate import simulate
from schedsim.traces.table import Trace

ROOT = Path(__file__).resolve().parents[3]
LINEAR = ROOT / "tests" / "data" / "linear_profile.csv"
GRID = {"batch": [1, 8, 32], "slowdown": [[1.3, 1.6, 3.0],
                                          [1.2, 1.5, 2.5],
                                          [1.05, 1.2, 1.9]]}


def model(grid=GRID, **kw) -> CostModel:
    """The linear test profile (spread none) with a two-instance model carrying ``grid``."""
    profile = load_profile(LINEAR)
    cost = CostModel.from_profile(profile, spread="none", **kw)
    duo = dataclasses.replace(profile, meta=dict(profile.meta, instances=2, pair_slowdown=grid))
    return cost.with_contention({2: CostModel.from_profile(duo, spread="none")})


def test_the_grid_is_exact_at_measured_sizes_bilinear_between_and_flat_beyond():
    p = PairSlowdown(**GRID)
    assert p.slowdown(8, 32) == 2.5 and p.slowdown(32, 1) == 1.05
    # Halfway between 8 and 32 on both axes: the mean of the four corners.
    assert p.slowdown(20, 20) == pytest.approx((1.5 + 2.5 + 1.2 + 1.9) / 4)
    assert p.slowdown(64, 64) == 1.9 and p.slowdown(1, 100) == 3.0


def test_a_ratio_under_one_is_noise_and_reads_as_one():
    p = PairSlowdown([1, 2], [[0.97, 1.1], [1.2, 1.3]])
    assert p.slowdown(1, 1) == 1.0 and p.slowdown(2, 2) == 1.3


@pytest.mark.parametrize("batch, slowdown, what", [
    ([], [], "non-empty"),
    ([1, 1], [[1, 1], [1, 1]], "strictly increasing"),
    ([1, 2], [[1, 1]], "2x2 grid"),
    ([1, 2], [[1, 1], [1, -1]], "> 0"),
    ([1, 2], [[1, 1], [1, "x"]], "lists of numbers"),
])
def test_bad_grids_are_refused_with_the_field_named(batch, slowdown, what):
    with pytest.raises(InputError, match=f"pair_slowdown: .*{what}"):
        PairSlowdown.from_meta({"pair_slowdown": {"batch": batch, "slowdown": slowdown}}, "p.csv")


def test_shared_gpu_re_times_the_other_batch_when_one_starts_and_ends():
    gpu = SharedGpu(PairSlowdown(**GRID))
    gpu.start(0, 0, 1000, 32, "big")
    assert gpu.retime(0) == [(0, 1000, 1)]                 # alone: its time alone
    gpu.start(1, 400, 500, 1, "small")
    # From 400 the big batch runs at 1/1.05 and the small one at 1/3.0.
    (i0, end0, g0), (i1, end1, g1) = gpu.retime(400)
    assert (i0, end0) == (0, 400 + round(600 * 1.05)) and (i1, end1) == (1, 400 + 1500)
    assert not gpu.is_current(0, 1) and gpu.is_current(0, g0)
    assert gpu.finish(0, end0) == "big"
    # The small one did (1030 - 400) / 3 = 210 ns of its 500 and runs the rest alone.
    assert gpu.retime(end0) == [(1, end0 + 290, g1 + 1)]


def test_a_grid_of_ones_is_two_independent_servers_bit_for_bit():
    trace = Trace.from_arrivals(np.sort(np.random.default_rng(0).uniform(0, 0.5, 3000)))
    req = Requests.from_trace(trace)
    ones = {"batch": [1, 64], "slowdown": [[1.0, 1.0], [1.0, 1.0]]}
    plain = CostModel.from_profile(load_profile(LINEAR), spread="none")  # no contention model at all
    a = simulate(req, DynamicBatcher(max_batch_size=16, max_queue_delay_us=200), model(ones), instances=2, seed=1)
    b = simulate(req, DynamicBatcher(max_batch_size=16, max_queue_delay_us=200), plain, instances=2, seed=1)
    for col in ("batch_start_ns", "batch_end_ns", "batch_instance", "batch_samples"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col


def test_back_to_back_equal_batches_take_the_measured_pair_time():
    # 640 requests at t=0, static batches of 32 on two instances: always two batches of 32 at once.
    req = Requests.from_trace(Trace.from_arrivals(np.zeros(640)))
    r = simulate(req, StaticBatching(batch_size=32), model(), instances=2, seed=0)
    alone_ns = round(model().mean_s(32) * 1e9)
    assert np.allclose(r.batch_end_ns - r.batch_start_ns, alone_ns * 1.9, atol=2)


def _replayed_ends(r, pairs: PairSlowdown, alone_ns) -> np.ndarray:
    """Each batch's end by integrating its rate over the other instances' batches as logged:
    between consecutive starts and ends of the others, the rate is 1 / (1 + the excesses)."""
    s, e, inst, n = r.batch_start_ns, r.batch_end_ns, r.batch_instance, r.batch_samples
    ends = []
    for k in range(len(s)):
        other = np.flatnonzero(inst != inst[k])
        cuts = np.unique(np.concatenate([s[other], e[other]]))
        work, t = float(alone_ns[k]), float(s[k])
        for cut in [c for c in cuts.tolist() if c > t] + [np.inf]:
            running = [j for j in other if s[j] <= t < e[j]]
            rate = 1.0 / (1.0 + sum(pairs.slowdown(int(n[k]), int(n[j])) - 1.0 for j in running))
            step = min(work / rate, cut - t)
            work, t = work - step * rate, t + step
            if work <= 1e-9:
                break
        ends.append(t)
    return np.asarray(ends)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0, 0.02), min_size=1, max_size=120), st.integers(1, 16), st.integers(0, 400),
       st.integers(2, 4))
def test_every_batch_ends_when_its_work_is_done_at_the_rates_of_what_ran_beside_it(gaps, max_batch, delay_us,
                                                                                    instances):
    # The oracle: replay the logged schedule through the pair grid, independently of the driver.
    req = Requests.from_trace(Trace.from_arrivals(np.cumsum(gaps)))
    cost = model(wake_overhead_s=0.0)
    r = simulate(req, DynamicBatcher(max_batch_size=max_batch, max_queue_delay_us=delay_us), cost,
                 instances=instances, seed=0)
    alone = np.array([round(cost.mean_s(int(b)) * 1e9) for b in r.batch_samples])
    assert np.allclose(_replayed_ends(r, PairSlowdown(**GRID), alone), r.batch_end_ns, atol=3)
    assert (r.status == COMPLETED).all()


def test_same_seed_same_run_and_the_power_cap_only_moves_the_clock_state():
    req = Requests.from_trace(Trace.from_arrivals(np.sort(np.random.default_rng(2).uniform(0, 0.2, 4000))))
    pol = lambda: DynamicBatcher(max_batch_size=32, max_queue_delay_us=100)  # noqa: E731
    profile = load_profile(default_profile_path())
    assert "power_cap" in profile.meta and "pair_slowdown" in load_profile(
        ROOT / "profiles" / "bert-base-fp16-cg-2inst-h200.csv").meta
    runs = []
    for cap in (True, True, False):
        cost = CostModel.from_profile(profile, power_cap=cap)
        duo = load_profile(ROOT / "profiles" / "bert-base-fp16-cg-2inst-h200.csv")
        cost.with_contention({2: CostModel.from_profile(duo, wake_overhead_s=0.0)})
        runs.append(simulate(req, pol(), cost, instances=2, seed=5))
    assert np.array_equal(runs[0].end_ns, runs[1].end_ns)
    # The grid was measured with both instances busy, at that load's clock: not scaled again.
    assert np.array_equal(runs[0].end_ns, runs[2].end_ns)


def test_several_instances_add_their_pairwise_excess():
    # 960 requests at t=0, static batches of 32 on three instances: always three batches of 32
    # at once, each slowed by 1 + 2 x (1.9 - 1) = 2.8.
    req = Requests.from_trace(Trace.from_arrivals(np.zeros(960)))
    r = simulate(req, StaticBatching(batch_size=32), model(), instances=3, seed=0)
    alone_ns = round(model().mean_s(32) * 1e9)
    assert np.allclose(r.batch_end_ns - r.batch_start_ns, alone_ns * 2.8, atol=3)
    gpu = SharedGpu(PairSlowdown(**GRID))
    for i, b in enumerate((1, 8, 32)):
        gpu.start(i, 0, 1000, b, None)
    ends = {i: end for i, end, _ in gpu.retime(0)}
    assert ends == {0: math.ceil(1000 * (1 + 0.6 + 2.0) - 1e-6), 1: math.ceil(1000 * (1 + 0.2 + 1.5) - 1e-6),
                    2: math.ceil(1000 * (1 + 0.05 + 0.2) - 1e-6)}


def schedsim(*args):
    return subprocess.run([sys.executable, "-m", "schedsim.cli.main", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_run_reports_the_grid_in_use_and_a_bad_grid_is_a_one_line_error(tmp_path):
    trace = ROOT / "traces" / "poisson_2000rps.csv"
    proc = schedsim("run", trace, "--instances", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["pair_slowdown"].endswith("bert-base-fp16-cg-2inst-h200.csv")
    one = schedsim("run", trace, "--json")
    assert json.loads(one.stdout)["config"]["pair_slowdown"] is None
    src = ROOT / "profiles" / "bert-base-fp16-cg-2inst-h200"
    meta = json.loads(src.with_suffix(".json").read_text())
    meta["pair_slowdown"]["slowdown"] = meta["pair_slowdown"]["slowdown"][:-1]
    meta.pop("samples", None)
    (tmp_path / "duo.csv").write_text(src.with_suffix(".csv").read_text())
    (tmp_path / "duo.json").write_text(json.dumps(meta))
    bad = schedsim("run", trace, "--instances", "2", "--contention-profile", tmp_path / "duo.csv")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"schedsim: error: {tmp_path / 'duo.csv'}: pair_slowdown: slowdown must be a 10x10 grid "
        "(one row and one column per batch size)"]


def test_profile_show_prints_the_pair_grid():
    proc = schedsim("profile", "show", ROOT / "profiles" / "bert-base-fp16-cg-2inst-h200.csv")
    assert proc.returncode == 0, proc.stderr
    assert ("pair slowdown (10 sizes, 1..64): beside the other instance's batch, b64 beside b1 takes x 1.11, "
            "b1 beside b64 x 4.49, b64 beside b64 x 1.98") in " ".join(proc.stdout.split())


def test_a_one_replica_fleet_shares_the_gpu_as_the_plain_simulation_does():
    from schedsim.planning.fleet import simulate_fleet
    from schedsim.registry import load_router

    req = Requests.from_trace(Trace.from_arrivals(np.sort(np.random.default_rng(4).uniform(0, 0.3, 2500))))
    make = lambda: DynamicBatcher(max_batch_size=16, max_queue_delay_us=100)  # noqa: E731
    fleet = simulate_fleet(req, make, model(), replicas=1, router=load_router("jsq"), instances=2, seed=3)
    alone = simulate(req, make(), model(), instances=2, seed=3)
    assert np.array_equal(fleet.result.end_ns, alone.end_ns)
    assert np.array_equal(fleet.result.batch_end_ns, alone.batch_end_ns)
    # and the sharing is on: without the grid the same run differs
    flat = simulate(req, make(), model({"batch": [1, 64], "slowdown": [[1.0, 1.0], [1.0, 1.0]]}), instances=2, seed=3)
    assert not np.array_equal(flat.end_ns, alone.end_ns)
