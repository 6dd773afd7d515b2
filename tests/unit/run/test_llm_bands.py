"""LLM prediction bands (schedsim.run.llm_bands): the step profile's spread split into per-step
noise and a per-run level, the band's coverage of the simulator's own independent runs, how
its width follows trace length, and the point estimate it leaves alone."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from schedsim.core.policy import Requests
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import load_step_profile
from schedsim.registry import build_policy
from schedsim.run import bands
from schedsim.run.llm_bands import NO_HOST_RECORD, NoisyStepCost, StepSpread, llm_one, noisy
from schedsim.run.runner import execute
from schedsim.run.spec import LLMOptions, RunSpec
from schedsim.traces.io import save_trace
from schedsim.run.llm_runner import default_step_profile_path
from schedsim.traces.table import Trace

PROFILE = load_step_profile(default_step_profile_path())
COST = StepCostModel.from_profile(PROFILE)
SPREAD = StepSpread.from_profile(PROFILE)
TIMELINE = {"between_runs_cv": 0.02, "within_run_cv": 0.05, "window_s": 0.05, "round_factors": [1.0, 0.9, 1.1],
            "window_factors": [[1.0, 1.0, 0.9, 1.6, 1.7], [0.9, 1.0, 1.0, 1.1, 0.9], [1.5, 1.6, 1.4, 0.9, 0.8]]}
KEYS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms")


def _trace(n: int, rate: float = 8.0, seed: int = 1) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace.from_arrivals(np.cumsum(rng.exponential(1 / rate, n)), input_tokens=rng.integers(50, 1500, n),
                               output_tokens=rng.integers(20, 300, n))


def _one(trace: Trace, spread=SPREAD, cost=COST):
    spec = RunSpec(trace=Path("unused.csv"), policy="paged-kv")
    return llm_one(spec, trace, Requests.from_trace(trace), build_policy("paged-kv", {}), cost, {}, spread)


def test_spread_from_the_bundled_profile_splits_level_and_steps():
    """The per-run level is the drift record's common shift scaled to one round; the per-step
    noise is each composition's spread less it, graph decode steps apart from eager ones."""
    drift = PROFILE.meta["drift"]["median_change"]
    rounds = PROFILE.meta["sampling"]["rounds"]
    assert SPREAD.rounds == rounds == 11
    assert SPREAD.level_sigma == pytest.approx(abs(math.log1p(drift)) * math.sqrt(rounds / 6))
    assert 0 < SPREAD.level_sigma < 0.01
    graph = (PROFILE.columns["prefill_seqs"] == 0) & (PROFILE.columns["decode_seqs"] <= 256)
    assert SPREAD.graph_log_sd.size == graph.sum() and SPREAD.eager_log_sd.size == (~graph).sum()
    cv = PROFILE.columns["latency_ms_std"] / PROFILE.columns["latency_ms_mean"]
    cv_step = np.sqrt(np.maximum(cv ** 2 - math.expm1(SPREAD.level_sigma ** 2), 0))
    assert np.allclose(np.sqrt(np.expm1(SPREAD.graph_log_sd ** 2)), cv_step[graph])
    assert 0.01 < SPREAD.rms_cv(0) < 0.05
    # Eager steps: the spread falls with the step's tokens (launches and first calls below 1,000).
    eager = [SPREAD.rms_cv(k) for k in range(1, 5)]
    assert eager == sorted(eager, reverse=True) and eager[0] > 0.15 and eager[-1] < 0.03
    tokens = PROFILE.columns["prefill_seqs"] * PROFILE.columns["prefill_chunk"] + PROFILE.columns["decode_seqs"]
    assert np.array_equal(SPREAD.eager_tokens, tokens[~graph])
    assert [StepSpread.eager_class(t) for t in (1, 256, 257, 4096, 8192)] == [0, 0, 1, 2, 3]
    assert "step-time draws" in SPREAD.describe() and "drift record" in SPREAD.level_source()
    no_std = dataclasses.replace(PROFILE, columns={k: v for k, v in PROFILE.columns.items() if k != "latency_ms_std"})
    assert StepSpread.from_profile(no_std) is None
    assert noisy(COST, None, 3) is COST


def test_step_noise_has_mean_one_and_runs_average_it_out():
    cost = NoisyStepCost(COST, SPREAD, np.random.default_rng(0))
    ones = np.ones(8, np.int32)
    ctx = np.full(8, 1000, np.int32)
    base = COST.step_ns(ones, ctx)
    draws = np.array([cost.step_ns(ones, ctx) for _ in range(20_000)]) / base
    assert draws.mean() == pytest.approx(1.0, abs=0.002)
    assert draws.std() == pytest.approx(SPREAD.rms_cv(0), rel=0.1)
    for tokens, k in ((512, 2), (8192, 4)):   # a chunk draws from its own token-count class
        chunk = (np.array([tokens], np.int32), np.array([0], np.int32))
        eager = np.array([cost.step_ns(*chunk) for _ in range(20_000)]) / COST.step_ns(*chunk)
        assert eager.mean() == pytest.approx(1.0, abs=0.01)
        assert eager.std() == pytest.approx(SPREAD.rms_cv(k), rel=0.15)
    # A run of 400 decode steps draws the noise of its mean: sd cv / 20.
    counts, prices = COST.decode_run_segments(ctx, 400)
    runs = np.array([np.dot(*cost.decode_run_segments(ctx, 400)) for _ in range(4000)]) / np.dot(counts, prices)
    assert runs.std() == pytest.approx(SPREAD.rms_cv(0) / 20, rel=0.15)
    assert np.array_equal(cost.decode_run_ns(ctx, 0), COST.decode_run_ns(ctx, 0))


def test_llm_band_covers_the_simulators_own_independent_runs_90_percent_of_the_time():
    """Simulated "live" runs of a known model (step times and the run's level drawn with seeds
    the band never uses) land inside the 90% band 85-95% of the time, for TTFT, TPOT and E2E
    p50 and p99. The level is set to 3% here, so that both sources count."""
    spread = dataclasses.replace(SPREAD, level_sigma=0.03)
    trace = _trace(40)
    one = _one(trace, spread)
    plan = bands.BandPlan(0.9, 19)
    inside = {k: [] for k in KEYS}
    rng = np.random.default_rng(77)
    for b in range(40):   # many bands, few runs each: each band's own coverage varies
        band = bands.compute_band(plan, 40_000 + b, one, KEYS, draws=spread.describe(),
                                  level_sigma=spread.level_sigma)
        for live_seed in range(10):
            live = one(3_000_000 + 100 * b + live_seed, float(np.exp(0.03 * rng.standard_normal())), None)
            for k in KEYS:
                inside[k].append(band[f"{k}_lo"] <= live[k] <= band[f"{k}_hi"])
    coverage = {k: np.mean(v) for k, v in inside.items()}
    assert 0.85 <= np.mean(list(coverage.values())) <= 0.95, coverage
    for k in KEYS:
        assert 0.8 <= coverage[k] <= 0.97, coverage


def test_llm_band_narrows_with_trace_length():
    """Per-step noise averages out over a run: with the level left out, 16x the requests give
    about a quarter the width for the means (each over all of a run's requests); the per-run
    level does not average out."""
    spread = dataclasses.replace(SPREAD, level_sigma=0.0)
    plan = bands.BandPlan(0.9, 39)
    widths = {}
    for n in (50, 800):
        one = _one(_trace(n, rate=6.0, seed=4), spread)
        band = bands.compute_band(plan, 5, one, ("ttft_mean_ms", "e2e_mean_ms"), draws="steps")
        widths[n] = {k: (band[f"{k}_hi"] - band[f"{k}_lo"]) / ((band[f"{k}_hi"] + band[f"{k}_lo"]) / 2)
                     for k in ("ttft_mean_ms", "e2e_mean_ms")}
    # 1/sqrt(n) says 4; each width is the range of 39 draws (about 12% of its own noise), and
    # E2E, whose decode steps the running requests share, came out 2.5 and 3.4 over two band seeds.
    assert 2.5 <= widths[50]["ttft_mean_ms"] / widths[800]["ttft_mean_ms"] <= 6.5, widths
    assert 2.0 <= widths[50]["e2e_mean_ms"] / widths[800]["e2e_mean_ms"] <= 6.5, widths
    # The per-run level does not average out: a floor on the width.
    level = dataclasses.replace(SPREAD, level_sigma=0.05)
    band = bands.compute_band(plan, 5, _one(_trace(800, rate=6.0, seed=4), level), ("e2e_mean_ms",),
                              draws="steps", level_sigma=0.05)
    assert (band["e2e_mean_ms_hi"] - band["e2e_mean_ms_lo"]) / band["e2e_mean_ms_lo"] > 0.1


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    return save_trace(_trace(60), tmp_path_factory.mktemp("llm_bands") / "t.csv")


def test_run_keeps_the_point_estimate_bit_for_bit_and_names_its_sources(trace_file):
    plain = execute(RunSpec(trace=trace_file, policy="paged-kv", band=0))
    banded = execute(RunSpec(trace=trace_file, policy="paged-kv"))
    assert "ttft_p99_ms_lo" not in plain.summary
    for key in bands.LLM_KEYS:
        assert banded.summary[key] == plain.summary[key]
        assert banded.summary[f"{key}_lo"] <= banded.summary[f"{key}_hi"]
    band = banded.summary["band"]
    assert any(s.startswith("step-time draws") for s in band["sources"])
    assert any(s.startswith("per-run level") for s in band["sources"]) and band["level_sigma"] > 0
    assert band["absent"] == [NO_HOST_RECORD] and band["host_sigma"] == 0
    assert f"not in the band: {NO_HOST_RECORD}" in bands.band_text(banded.summary)
    assert banded.summary["ttft_p99_ms_hi"] > banded.summary["ttft_p99_ms_lo"]
    again = execute(RunSpec(trace=trace_file, policy="paged-kv")).summary
    assert {k: again[k] for k in again if k.endswith(("_lo", "_hi"))} == \
        {k: banded.summary[k] for k in banded.summary if k.endswith(("_lo", "_hi"))}


def test_replication_0_is_the_point_estimate_and_later_ones_draw(trace_file):
    one = execute(RunSpec(trace=trace_file, policy="paged-kv", band=0)).results[0]
    three = execute(RunSpec(trace=trace_file, policy="paged-kv", band=0, replications=3)).results
    for name in ("first_token_ns", "end_ns", "step_end_ns"):
        assert np.array_equal(getattr(three[0], name), getattr(one, name))
    assert not np.array_equal(three[1].end_ns, one.end_ns)
    assert not np.array_equal(three[1].end_ns, three[2].end_ns)
    again = execute(RunSpec(trace=trace_file, policy="paged-kv", band=0, replications=3)).results
    assert np.array_equal(again[2].end_ns, three[2].end_ns)


def test_a_host_record_with_a_timeline_runs_the_llm_trace_on_host_time(tmp_path, trace_file):
    """A step profile whose sidecar has a host_variation timeline: the band replays it (no
    log-normal factor, no 'absent'); on a host twice as slow a light run takes about twice as long."""
    meta = dict(PROFILE.meta) | {"host_variation": TIMELINE}
    prof = tmp_path / "steps.csv"
    shutil.copy(default_step_profile_path(), prof)
    prof.with_suffix(".json").write_text(json.dumps(meta))
    s = execute(RunSpec(trace=trace_file, policy="paged-kv", profile=prof), LLMOptions()).summary
    assert any("measured rounds" in x for x in s["band"]["sources"])
    assert "absent" not in s["band"] and s["band"]["host_sigma"] == 0
    slow = dict(TIMELINE) | {"window_factors": [[2.0] * 5] * 3, "round_factors": [1.0] * 3}
    cost = StepCostModel.from_profile(dataclasses.replace(PROFILE, meta=dict(PROFILE.meta) | {"host_variation": slow}))
    light = _trace(20, rate=0.1, seed=2)   # requests 10 s apart: none waits for another
    base = _one(light, None)(1, 1.0, None)
    twice = _one(light, None, cost)(1, 1.0, None)
    for k in ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms"):
        assert twice[k] == pytest.approx(2 * base[k], rel=0.02), k


def test_validate_reports_the_llm_bands_coverage_of_several_live_runs(tmp_path, trace_file):
    """``schedsim validate`` on an LLM prediction with a band and three live runs: each live
    run's TTFT/TPOT/E2E p50 and p99 in or out of the band, its coverage, and the band's
    half-width against the live runs' spread."""
    from schedsim.live.llm_validate import validate_llm_dirs

    sim = tmp_path / "sim"
    s = execute(RunSpec(trace=trace_file, policy="paged-kv", out=sim)).summary
    lives = []
    for i, f in enumerate((0.999, 1.0, 1.5)):   # inside, inside, outside
        live = tmp_path / f"live{i}"
        shutil.copytree(sim, live)
        summary = {k: v for k, v in s.items() if not k.endswith(("_lo", "_hi")) and k != "band"}
        summary["config"] = {k: v for k, v in s["config"].items() if k != "replications"} | {"driver": "live"}
        for key in KEYS:
            summary[key] = s[key] * f if f != 1.0 else (s[f"{key}_lo"] + s[f"{key}_hi"]) / 2
        (live / "summary.json").write_text(json.dumps(summary))
        lives.append(live)
    report = validate_llm_dirs(sim, lives, out=tmp_path / "v")
    for key in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99"):
        row = report["metrics"][key]
        lo, hi = row["predicted_band"]
        assert (lo, hi) == (s[f"{key}_ms_lo"], s[f"{key}_ms_hi"])
        assert row["runs_in_band"][1:] == [True, False], key
        assert row["band_half_width_pct"] > 0 and row["live_spread_pct"] > 0
    assert 0 < report["band"]["runs_covered"] < 1


def test_llm_runs_get_a_default_band_up_to_their_own_length():
    plan, note = bands.plan_band(None, bands.LLM_AUTO_MAX_REQUESTS + 1, auto_max=bands.LLM_AUTO_MAX_REQUESTS)
    assert plan is None and f"more than {bands.LLM_AUTO_MAX_REQUESTS:,}" in note and "--band 0.9" in note
    assert bands.plan_band(None, bands.LLM_AUTO_MAX_REQUESTS, auto_max=bands.LLM_AUTO_MAX_REQUESTS)[0].level == 0.9
    assert bands.plan_band(0.9, 10 * bands.LLM_AUTO_MAX_REQUESTS, auto_max=bands.LLM_AUTO_MAX_REQUESTS)[0] is not None
