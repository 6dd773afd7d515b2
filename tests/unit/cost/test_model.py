"""Cost model: interpolation, refusal and extrapolation, spreads, overhead, determinism."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from schedsim.cost.model import CostModel
from schedsim.errors import InputError
from schedsim.cost.profile import Profile, save_profile


def cell_stats(x):
    x = np.sort(np.asarray(x, dtype=np.float64))
    return dict(latency_ms_mean=x.mean(), latency_ms_p50=np.quantile(x, 0.5),
                latency_ms_p90=np.quantile(x, 0.9), latency_ms_p99=np.quantile(x, 0.99),
                latency_ms_std=x.std(), n=x.size, latency_ms_min=x.min(), latency_ms_max=x.max())


def constant_table(means, seq_lens=None):
    """Zero-spread table; means is {batch: ms} or {(batch, seq_len): ms}."""
    rows = []
    for key, m in means.items():
        b, s = key if isinstance(key, tuple) else (key, None)
        row = dict(batch=b, latency_ms_mean=m, latency_ms_p50=m, latency_ms_p90=m, latency_ms_p99=m,
                   latency_ms_std=0.0, n=10)
        if s is not None:
            row["seq_len"] = s
        rows.append(row)
    return pd.DataFrame(rows)


def sampled_profile(tmp_path, batches=(1, 2, 4, 8), n=2000, seed=0, meta=None, name="p.csv"):
    """A profile with raw samples (gamma, scale growing with batch), written and loaded from disk."""
    rng = np.random.default_rng(seed)
    samples, rows = {}, []
    for b in batches:
        # GPU-like: a floor that grows with batch, a few % right-skewed jitter.
        x = (0.5 + 0.25 * b) * (1.0 + rng.gamma(2.0, 0.03, n))
        samples[(b, 0)] = x
        rows.append(dict(batch=b, **cell_stats(x.astype(np.float32))))
    return save_profile(pd.DataFrame(rows), meta or {"model": "test"}, tmp_path / name, samples=samples)


# ----------------------------------------------------------------------------- interpolation

def test_zero_spread_is_deterministic_mean(tmp_path):
    prof = save_profile(constant_table({1: 1.1, 2: 1.7, 4: 3.3}), {}, tmp_path / "p.csv")
    for spread in ("auto", "fitted", "none"):
        cm = CostModel.from_profile(prof, spread=spread)
        rng = np.random.default_rng(0)
        for b in (1, 2, 3, 4):
            draws = {cm.sample_s(b, 0, rng) for _ in range(200)}
            assert draws == {cm.mean_s(b)}
        assert cm.mean_s(2) == 1.7 / 1000.0
    assert CostModel.from_profile(prof).spread == "none"


def test_exact_at_measured_points_and_linear_between():
    prof = Profile.from_frame(constant_table({1: 1.0, 2: 2.0, 4: 3.0, 8: 7.0, 16: 7.5}))
    cm = CostModel.from_profile(prof)
    for b, m in [(1, 1.0), (2, 2.0), (4, 3.0), (8, 7.0), (16, 7.5)]:
        assert cm.mean_s(b) == m / 1000.0
    assert cm.mean_s(3) == pytest.approx(2.5e-3, rel=1e-12)
    assert cm.mean_s(5) == pytest.approx(4.0e-3, rel=1e-12)
    assert cm.mean_s(12) == pytest.approx(7.25e-3, rel=1e-12)
    assert cm.max_batch == 16 and cm.min_batch == 1
    assert cm.mean_s(5, 999) == cm.mean_s(5)  # no seq_len in the table: ignored


def test_noisy_table_kept_as_measured():
    # Real tables are sometimes slightly non-monotone; measured points stay unchanged.
    prof = Profile.from_frame(constant_table({1: 2.0, 2: 1.9, 4: 3.0}))
    cm = CostModel.from_profile(prof)
    assert cm.mean_s(2) == 1.9 / 1000.0 and cm.mean_s(1) == 2.0 / 1000.0
    assert cm.mean_s(3) == pytest.approx(2.45e-3, rel=1e-12)


def test_bilinear_in_seq_len():
    means = {(1, 128): 1.0, (4, 128): 4.0, (1, 256): 3.0, (4, 256): 9.0}
    cm = CostModel.from_profile(Profile.from_frame(constant_table(means)))
    for (b, s), m in means.items():
        assert cm.mean_s(b, s) == m / 1000.0
    # batch 2 (w=1/3), seq 192 (w=1/2): rows 2.0 and 5.0 -> 3.5
    assert cm.mean_s(2, 192) == pytest.approx(3.5e-3, rel=1e-12)
    assert cm.mean_s(4, 160) == pytest.approx((4.0 * 0.75 + 9.0 * 0.25) / 1000.0, rel=1e-12)
    rng = np.random.default_rng(0)
    assert cm.sample_s(2, 192, rng) == cm.mean_s(2, 192)


def test_single_measured_seq_len_serves_requests_without_one():
    means = {(1, 128): 1.0, (4, 128): 2.0}
    cm = CostModel.from_profile(Profile.from_frame(constant_table(means)))
    assert cm.mean_s(2, 0) == cm.mean_s(2, 128) and cm.covers(2, 0)
    cm.check_covers(4, [0, 128])
    cm.check_covers(4, ())
    assert not cm.covers(2, 256)
    with pytest.raises(InputError, match=r"covers seq_len 128\.\.128, but the trace has seq_len up to 256"):
        cm.check_covers(4, [0, 256])
    with pytest.raises(ValueError, match="not 256"):
        cm.mean_s(2, 256)


def test_bundled_default_profile():
    from schedsim.cost.profile import default_profile_path, load_profile
    path = default_profile_path()
    if not path.exists():
        pytest.skip("no bundled default profile")
    prof = load_profile(path)
    cm = CostModel.from_profile(prof)
    table = prof.table.set_index("batch")
    overhead = prof.meta.get("dispatch_overhead_us", 0.0) * 1e-6
    per_sample = prof.meta.get("dispatch_overhead_us_per_sample", 0.0) * 1e-6
    cm.check_covers(cm.max_batch, ())
    for b in (1, cm.max_batch):
        assert cm.mean_s(b) == pytest.approx(table.loc[b, "latency_ms_mean"] / 1000.0 + overhead
                                             + per_sample * (b - 1), rel=1e-12)
        assert cm.sample_s(b, 0, np.random.default_rng(0)) > 0


def test_max_seq_len_truncates():
    means = {(1, 128): 1.0, (1, 512): 3.0}
    prof = Profile.from_frame(constant_table(means))
    cm = CostModel.from_profile(prof, max_seq_len=512)
    assert cm.mean_s(1, 4096) == cm.mean_s(1, 512) == 3.0e-3
    assert cm.covers(1, 4096)
    cm.check_covers(1, [128, 4096])
    with pytest.raises(InputError, match="max_seq_len"):
        CostModel.from_profile(prof, max_seq_len=0)




@st.composite
def monotone_tables(draw):
    """Cells whose distributions are ordered in batch: each cell's sorted samples are the
    previous cell's plus a non-negative amount (location family), optionally on two seq_lens."""
    batches = sorted(draw(st.sets(st.integers(2, 48), min_size=1, max_size=5)) | {1})
    n = draw(st.integers(1, 40))
    base = np.sort(np.array(draw(st.lists(st.floats(0.0, 3.0), min_size=n, max_size=n))))
    steps = draw(st.lists(st.floats(0.0, 4.0), min_size=len(batches), max_size=len(batches)))
    shift = 1.0 + np.cumsum(steps)
    two_seq = draw(st.booleans())
    seq_extra = {128: 0.0, 512: draw(st.floats(0.0, 5.0))} if two_seq else {0: 0.0}
    samples, rows = {}, []
    for s, extra in seq_extra.items():
        for b, c in zip(batches, shift):
            x = base + (c + extra)
            samples[(b, s)] = x
            row = dict(batch=b, **cell_stats(x))
            del row["latency_ms_min"], row["latency_ms_max"]
            row["latency_ms_mean"] = c + extra + 0.5  # monotone, independent of rounding in x.mean()
            if s:
                row["seq_len"] = s
            rows.append(row)
    return Profile.from_frame(pd.DataFrame(rows), samples=samples), two_seq


@settings(max_examples=60, deadline=None)
@given(monotone_tables(), st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=5))
def test_monotone_in_batch(case, us):
    prof, two_seq = case
    seqs = [128, 200, 512] if two_seq else [0]
    for spread in ("empirical", "none"):
        cm = CostModel.from_profile(prof, spread=spread, dispatch_overhead_s=1e-5)
        for s in seqs:
            means = [cm.mean_s(b, s) for b in range(1, cm.max_batch + 1)]
            assert all(a <= b for a, b in zip(means, means[1:])), (spread, s, means)
            for u in us:
                q = [cm.quantile_s(b, s, u) for b in range(1, cm.max_batch + 1)]
                assert all(a <= b for a, b in zip(q, q[1:])), (spread, s, u, q)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 3.0), min_size=2, max_size=5),
       st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.floats(0.0, 1.0),
       st.floats(0.0, 1.0, exclude_max=True))
def test_fitted_monotone_in_batch(steps, lo_off, p90_off, p99_extra, hi_extra, u):
    """Fitted cells of one shape at non-decreasing locations: draws at the same u are
    non-decreasing in batch up to float rounding in building each cell (1e-12 relative)."""
    batches = [1, 2, 4, 8, 16][:len(steps)]
    rows = []
    for b, c in zip(batches, 5.0 + np.cumsum(steps)):
        rows.append(dict(batch=b, latency_ms_mean=c + 0.3 * p90_off, latency_ms_p50=c,
                         latency_ms_p90=c + p90_off, latency_ms_p99=c + p90_off + p99_extra,
                         latency_ms_std=0.1, n=100, latency_ms_min=c - lo_off,
                         latency_ms_max=c + p90_off + p99_extra + hi_extra))
    cm = CostModel.from_profile(Profile.from_frame(pd.DataFrame(rows)), spread="fitted")
    q = [cm.quantile_s(b, 0, u) for b in range(1, cm.max_batch + 1)]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(q, q[1:])), q


# ----------------------------------------------------------------------------- coverage

def test_refuses_to_extrapolate_with_message(tmp_path):
    prof = save_profile(constant_table({1: 1.0, 8: 2.0, 32: 5.0}), {}, tmp_path / "x.csv")
    cm = CostModel.from_profile(prof)
    assert cm.covers(32) and cm.covers(5) and not cm.covers(33)
    cm.check_covers(32, [], "--max-batch-size")
    with pytest.raises(InputError) as e:
        cm.check_covers(64, [], "--max-batch-size")
    assert str(e.value) == (f"profile {tmp_path / 'x.csv'} covers batch sizes 1..32, but the policy may launch "
                            "batches of 64 samples (--max-batch-size); pass --extrapolate or measure larger batches")
    with pytest.raises(ValueError, match=r"covers batch sizes 1\.\.32, not 33"):
        cm.mean_s(33)
    with pytest.raises(ValueError, match="not 33"):
        cm.sample_s(33, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="integer number >= 1"):
        cm.mean_s(0)


def test_refuses_small_batches_and_seq_lens():
    cm = CostModel.from_profile(Profile.from_frame(constant_table({4: 1.0, 8: 2.0})))
    with pytest.raises(InputError, match=r"covers batch sizes 4\.\.8, but the policy may launch batches of 1 sample"):
        cm.check_covers(8, None, "--max-batch-size")
    means = {(1, 128): 1.0, (2, 128): 2.0, (1, 256): 3.0, (2, 256): 4.0}
    cm = CostModel.from_profile(Profile.from_frame(constant_table(means)))
    cm.check_covers(2, [128, 200, 256])
    assert cm.covers(2, 200) and not cm.covers(2, 300) and not cm.covers(2, 0)
    with pytest.raises(InputError, match=r"covers seq_len 128\.\.256, but trace\.csv has seq_len up to 300; pass --extrapolate"):
        cm.check_covers(2, [128, 300], seq_what="trace.csv")
    with pytest.raises(InputError, match=r"has seq_len down to 64; pass --extrapolate or measure shorter"):
        cm.check_covers(2, [64, 128])
    with pytest.raises(InputError, match=r"depends on seq_len \(measured 128\.\.256\), but the trace has requests without a seq_len"):
        cm.check_covers(2, [0, 128])
    with pytest.raises(ValueError, match=r"covers seq_len 128\.\.256, not 300"):
        cm.mean_s(1, 300)


def test_extrapolation_when_allowed():
    prof = Profile.from_frame(constant_table({2: 2.0, 4: 3.0, 8: 5.0}))
    cm = CostModel.from_profile(prof, extrapolate=True)
    cm.check_covers(64, [1, 2, 3])
    assert not cm.covers(16)
    assert cm.mean_s(16) == pytest.approx(9.0e-3, rel=1e-12)  # slope 0.5 ms/sample from (4, 8)
    assert cm.mean_s(1) == 2.0e-3  # linear gives 1.5, never below the smallest measured latency
    assert cm.sample_s(16, 0, np.random.default_rng(0)) == cm.mean_s(16)
    means = {(1, 128): 1.0, (1, 256): 3.0}
    cm = CostModel.from_profile(Profile.from_frame(constant_table(means)), extrapolate=True)
    assert cm.mean_s(1, 512) == pytest.approx(7.0e-3, rel=1e-12)
    assert cm.mean_s(1, 64) == 1.0e-3  # linear gives 0, floored at the smallest measured


def test_extrapolated_draws_stay_monotone_in_u(tmp_path):
    prof = sampled_profile(tmp_path, batches=(1, 2, 4))
    cm = CostModel.from_profile(prof, extrapolate=True)
    q = [cm.quantile_s(64, 0, u) for u in np.linspace(0, 0.999, 200)]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(q, q[1:]))  # exact in batch; in u, up to rounding
    assert min(q) >= prof.samples[(1, 0)].min() / 1000.0


# ----------------------------------------------------------------------------- spread

def test_empirical_reproduces_samples(tmp_path):
    prof = sampled_profile(tmp_path)
    cm = CostModel.from_profile(prof)
    assert cm.spread == "empirical"
    rng = np.random.default_rng(42)
    for b in (1, 8):
        draws = np.array([cm.sample_s(b, 0, rng) for _ in range(5000)])
        assert stats.ks_2samp(draws * 1000.0, prof.samples[(b, 0)]).pvalue > 0.01
        assert cm.mean_s(b) == prof.table.set_index("batch").loc[b, "latency_ms_mean"] / 1000.0


def test_empirical_between_batches_interpolates_quantiles(tmp_path):
    prof = sampled_profile(tmp_path, batches=(2, 4))
    cm = CostModel.from_profile(prof, spread="empirical")
    for u in (0.0, 0.1, 0.5, 0.9, 0.999):
        lo, hi = cm.quantile_s(2, 0, u), cm.quantile_s(4, 0, u)
        assert cm.quantile_s(3, 0, u) == pytest.approx((lo + hi) / 2, rel=1e-12)


def test_fitted_matches_table_moments(tmp_path):
    prof = sampled_profile(tmp_path)
    table = prof.table.set_index("batch")
    for drop_minmax in (False, True):
        p = Profile.from_frame(prof.table.drop(columns=["latency_ms_min", "latency_ms_max"])) if drop_minmax \
            else Profile.from_frame(prof.table)
        cm = CostModel.from_profile(p)
        assert cm.spread == "fitted"
        rng = np.random.default_rng(7)
        for b in (1, 4, 8):
            row = table.loc[b]
            draws = cm.sample_many_s(np.full(40000, b), 0, rng) * 1000.0
            assert draws.mean() == pytest.approx(row.latency_ms_mean, rel=0.01)
            for u, col in ((0.5, "latency_ms_p50"), (0.9, "latency_ms_p90"), (0.99, "latency_ms_p99")):
                assert np.quantile(draws, u) == pytest.approx(row[col], rel=0.01), (b, col)
                assert cm.quantile_s(b, 0, u) * 1000.0 == pytest.approx(row[col], rel=0.01)
            # The fitted grid's mean is the table mean, exactly up to rounding.
            us = (np.arange(20000) + 0.5) / 20000
            assert np.mean([cm.quantile_s(b, 0, u) for u in us]) == pytest.approx(cm.mean_s(b), rel=1e-4)


def test_mean_is_the_table_mean_even_for_constant_samples():
    df = constant_table({1: 1.5, 2: 2.5})
    prof = Profile.from_frame(df, samples={(1, 0): [1.0, 1.0], (2, 0): [2.0, 2.0]})
    cm = CostModel.from_profile(prof)
    assert cm.spread == "empirical"
    assert cm.mean_s(1) == 1.5e-3 and cm.sample_s(1, 0, np.random.default_rng(0)) == 1.0e-3
    assert cm.mean_s(2) == 2.5e-3 and cm.sample_s(2, 0, np.random.default_rng(0)) == 2.0e-3


def test_spread_choices():
    prof = Profile.from_frame(constant_table({1: 1.0}).assign(latency_ms_std=0.1, latency_ms_p90=1.1,
                                                              latency_ms_p99=1.2))
    assert CostModel.from_profile(prof).spread == "fitted"
    assert CostModel.from_profile(prof, spread="none").sample_s(1, 0, np.random.default_rng(0)) == 1.0e-3
    with pytest.raises(InputError, match="spread 'empirical' needs raw samples"):
        CostModel.from_profile(prof, spread="empirical")
    with pytest.raises(InputError, match=r"spread: 'gamma' is not one of auto, empirical, fitted, none"):
        CostModel.from_profile(prof, spread="gamma")


def test_fitted_mean_exact_on_wide_skewed_cells():
    """Wide, skewed cells (CV 35%, far outlier minimum): the shift keeps the mean exact and
    moves the percentiles by a few percent of p50 at most."""
    x = np.random.default_rng(0).gamma(8.0, 0.125, 20000)
    prof = Profile.from_frame(pd.DataFrame([dict(batch=1, **cell_stats(x))]))
    cm = CostModel.from_profile(prof, spread="fitted")
    draws = cm.sample_many_s(np.ones(40000, int), 0, np.random.default_rng(1)) * 1000.0
    assert draws.mean() == pytest.approx(x.mean(), rel=0.01)
    assert np.quantile(draws, 0.5) == pytest.approx(np.quantile(x, 0.5), rel=0.1)
    assert draws.min() > 0


# ----------------------------------------------------------------------------- overhead, determinism

def test_dispatch_overhead_added(tmp_path):
    prof = sampled_profile(tmp_path, meta={"dispatch_overhead_us": 40.0})
    base = CostModel.from_profile(prof, dispatch_overhead_s=0.0)
    cm = CostModel.from_profile(prof)
    assert cm.dispatch_overhead_s == pytest.approx(40e-6)
    assert cm.mean_s(3) == pytest.approx(base.mean_s(3) + 40e-6, rel=1e-12)
    a = cm.sample_many_s(np.arange(1, 9), 0, np.random.default_rng(1))
    b = base.sample_many_s(np.arange(1, 9), 0, np.random.default_rng(1))
    np.testing.assert_allclose(a - b, 40e-6, rtol=1e-9)
    override = CostModel.from_profile(prof, dispatch_overhead_s=1e-3)
    assert override.mean_s(1) == pytest.approx(base.mean_s(1) + 1e-3, rel=1e-12)
    zero = CostModel.from_profile(Profile.from_frame(constant_table({1: 1.0})), dispatch_overhead_s=2e-3)
    assert zero.sample_s(1, 0, np.random.default_rng(0)) == zero.mean_s(1) == 1e-3 + 2e-3
    with pytest.raises(InputError, match="dispatch_overhead_s"):
        CostModel.from_profile(prof, dispatch_overhead_s=-1.0)


def test_dispatch_overhead_per_sample(tmp_path):
    """The sidecar's per-sample term adds (b - 1) x it to a batch of b, in the mean and in
    every draw; an explicit constant overhead replaces both measured terms."""
    prof = sampled_profile(tmp_path, meta={"dispatch_overhead_us": 40.0, "dispatch_overhead_us_per_sample": 0.5})
    base = CostModel.from_profile(prof, dispatch_overhead_s=0.0)
    cm = CostModel.from_profile(prof)
    assert cm.dispatch_per_sample_s == pytest.approx(0.5e-6)
    sizes = np.arange(1, 9)
    for b in sizes.tolist():
        assert cm.dispatch_s(b) == pytest.approx(40e-6 + 0.5e-6 * (b - 1), rel=1e-12)
        assert cm.mean_s(b) == pytest.approx(base.mean_s(b) + cm.dispatch_s(b), rel=1e-12)
    a = cm.sample_many_s(sizes, 0, np.random.default_rng(1))
    b = base.sample_many_s(sizes, 0, np.random.default_rng(1))
    np.testing.assert_allclose(a - b, 40e-6 + 0.5e-6 * (sizes - 1), rtol=1e-9)
    assert cm.sample_s(5, 0, np.random.default_rng(3)) == pytest.approx(
        base.sample_s(5, 0, np.random.default_rng(3)) + 42e-6, rel=1e-12)
    assert CostModel.from_profile(prof, dispatch_overhead_s=1e-5).dispatch_s(8) == 1e-5
    both = CostModel.from_profile(prof, dispatch_overhead_s=1e-5, dispatch_per_sample_s=1e-6)
    assert both.dispatch_s(8) == pytest.approx(1.7e-5, rel=1e-12)
    with pytest.raises(InputError, match="dispatch_per_sample_s"):
        CostModel.from_profile(prof, dispatch_per_sample_s=-1e-6)


@pytest.mark.parametrize("spread", ["empirical", "fitted", "none"])
def test_determinism_and_one_uniform_per_draw(tmp_path, spread):
    prof = sampled_profile(tmp_path)
    cm = CostModel.from_profile(prof, spread=spread)
    sizes = np.random.default_rng(3).integers(1, 9, 500)
    r1, r2 = np.random.default_rng(9), np.random.default_rng(9)
    one = [cm.sample_s(int(b), 0, r1) for b in sizes]
    two = [CostModel.from_profile(prof, spread=spread).sample_s(int(b), 0, r2) for b in sizes]
    assert one == two
    many = cm.sample_many_s(sizes, 0, np.random.default_rng(9))
    assert many.tolist() == one  # bit for bit
    ref = np.random.default_rng(9)
    ref.random(500)
    assert r1.random() == ref.random()  # each draw consumed exactly one uniform


def test_sample_many_with_seq_lens_matches_scalar():
    rows = []
    for s in (128, 512):
        for b in (1, 4, 16):
            c = b * (1 + s / 256)
            rows.append(dict(batch=b, seq_len=s, latency_ms_mean=c * 1.05, latency_ms_p50=c,
                             latency_ms_p90=c * 1.2, latency_ms_p99=c * 1.5, latency_ms_std=0.1 * c, n=50))
    cm = CostModel.from_profile(Profile.from_frame(pd.DataFrame(rows)))
    rng = np.random.default_rng(5)
    b, s = rng.integers(1, 17, 300), rng.integers(128, 513, 300)
    many = cm.sample_many_s(b, s, np.random.default_rng(11))
    r = np.random.default_rng(11)
    assert many.tolist() == [cm.sample_s(int(x), int(y), r) for x, y in zip(b, s)]
