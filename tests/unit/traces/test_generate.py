"""Synthetic traces: arrival statistics against theory, length specs, determinism, CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from schedsim.cli.trace import app
from schedsim.errors import InputError
from schedsim.traces.table import Trace
from schedsim.traces.generate import (arrival_times, diurnal, gamma, generate, make_trace, onoff,
                                parse_length, poisson)
from schedsim.traces.io import load_trace, save_trace

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "traces"


def cv(x):
    g = np.diff(np.concatenate([[0.0], x]))
    return g.std() / g.mean()


# -------------------------------------------------------------------------- arrivals

def test_poisson_rate_and_cv():
    t = poisson(50.0, rng=np.random.default_rng(1), n=200_000)
    assert t.size == 200_000 and np.all(np.diff(t) >= 0) and t[0] > 0
    # Rate estimate n/T has relative sd 1/sqrt(n) = 0.22%; allow ~5 sd.
    assert 200_000 / t[-1] == pytest.approx(50.0, rel=0.012)
    assert cv(t) == pytest.approx(1.0, abs=0.012)


def test_poisson_duration_counts():
    counts = [poisson(20.0, rng=np.random.default_rng(s), duration_s=100.0).size for s in range(200)]
    # Poisson(2000) counts: mean 2000, variance 2000.
    assert np.mean(counts) == pytest.approx(2000, abs=5 * np.sqrt(2000 / 200))
    assert np.var(counts) == pytest.approx(2000, rel=0.3)
    t = poisson(20.0, rng=np.random.default_rng(0), duration_s=100.0)
    assert t[-1] < 100.0


def test_two_million_poisson_arrivals():
    # How fast is benchmarks/' business (ratios within one run), not a timed test's.
    t = poisson(1000.0, rng=np.random.default_rng(0), n=2_000_000)
    assert t.size == 2_000_000 and (np.diff(t) >= 0).all()
    assert np.diff(t).mean() == pytest.approx(1e-3, rel=0.01)


@pytest.mark.parametrize("target", [0.0, 0.5, 1.0, 3.0])
def test_gamma_cv(target):
    t = gamma(10.0, target, rng=np.random.default_rng(2), n=200_000)
    assert 200_000 / t[-1] == pytest.approx(10.0, rel=0.05 if target == 3.0 else 0.01)
    assert cv(t) == pytest.approx(target, abs=0.02 + 0.03 * target)


def test_onoff_silence_and_rate():
    t = onoff(40.0, 2.0, 3.0, rng=np.random.default_rng(3), duration_s=5000.0)
    phase = np.mod(t, 5.0)
    assert np.all(phase <= 2.0)  # nothing in off periods
    # Mean rate 40 * 2/5 = 16/s, count ~ Poisson(80,000).
    assert t.size == pytest.approx(80_000, abs=5 * np.sqrt(80_000))
    assert t[-1] < 5000.0
    # During on periods it is Poisson at 40/s: per-on-period counts have mean = var = 80.
    counts = np.bincount((t // 5.0).astype(int), minlength=1000)
    assert counts.mean() == pytest.approx(80, rel=0.02) and counts.var() == pytest.approx(80, rel=0.15)


def test_onoff_rate_off_and_n():
    t = onoff(40.0, 2.0, 3.0, rate_off=4.0, rng=np.random.default_rng(4), n=100_000)
    assert t.size == 100_000
    off = np.mod(t, 5.0) > 2.0
    span = t[-1]
    # Off periods get 4/s * 3 s of every 5 s; on periods 40/s * 2 s.
    assert off.sum() / (span * 3 / 5) == pytest.approx(4.0, rel=0.05)
    assert (~off).sum() / (span * 2 / 5) == pytest.approx(40.0, rel=0.02)


def test_diurnal_rate_shape():
    period, mean, amp = 100.0, 50.0, 0.8
    t = diurnal(mean, amp, period, rng=np.random.default_rng(5), duration_s=100 * period)
    assert t.size == pytest.approx(mean * 100 * period, rel=0.02)
    bins = 20
    hist = np.bincount((np.mod(t, period) / period * bins).astype(int), minlength=bins)
    centres = (np.arange(bins) + 0.5) / bins
    # Expected count per bin: integral of mean*(1 + amp*sin) over the bin, times 100 periods.
    lo, hi = np.arange(bins) / bins, np.arange(1, bins + 1) / bins
    expected = 100 * mean * period * ((hi - lo) + amp / (2 * np.pi) * (np.cos(2 * np.pi * lo) - np.cos(2 * np.pi * hi)))
    np.testing.assert_allclose(hist, expected, rtol=0.06)
    assert hist[np.argmax(np.sin(2 * np.pi * centres))] > 5 * hist[np.argmin(np.sin(2 * np.pi * centres))]
    t_n = diurnal(mean, amp, period, rng=np.random.default_rng(5), n=12_345)
    assert t_n.size == 12_345 and np.all(np.diff(t_n) >= 0)


@pytest.mark.parametrize("kind", ["poisson", "gamma", "onoff", "diurnal"])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**63), by_n=st.booleans())
def test_same_seed_bit_identical(kind, seed, by_n):
    kw = dict(rate=30.0, cv=2.0, on_s=1.0, off_s=1.5, amplitude=0.5, period_s=10.0,
              batch="uniform:1:8", input_tokens="lognormal:500:1.2", output_tokens="fixed:7")
    kw.update(n=500) if by_n else kw.update(duration_s=20.0)
    a = generate(kind, rng=np.random.default_rng(seed), **kw)
    b = generate(kind, rng=np.random.default_rng(seed), **kw)
    for f in ("arrival_s", "batch", "input_tokens", "output_tokens"):
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes()
    assert np.all(np.diff(a.arrival_s) >= 0) and np.all(a.arrival_s >= 0)
    if by_n:
        assert len(a) == 500
    else:
        assert np.all(a.arrival_s < 20.0)


def test_lengths_do_not_shift_arrivals():
    a = generate("poisson", rng=np.random.default_rng(9), n=100, rate=5.0)
    b = generate("poisson", rng=np.random.default_rng(9), n=100, rate=5.0, batch="uniform:1:4",
                 input_tokens="fixed:3")
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)


@pytest.mark.parametrize("call, message", [
    (lambda r: poisson(0, rng=r, n=5), "rate"),
    (lambda r: poisson(1, rng=r), "exactly one of n"),
    (lambda r: poisson(1, rng=r, n=5, duration_s=3), "exactly one of n"),
    (lambda r: poisson(1, rng=r, n=-1), "n:"),
    (lambda r: gamma(1, -1, rng=r, n=5), "cv"),
    (lambda r: onoff(1, 0, 1, rng=r, n=5), "on_s"),
    (lambda r: diurnal(1, 1.5, 10, rng=r, n=5), "amplitude"),
    (lambda r: arrival_times("weibull", rng=r, n=5, rate=1), "unknown"),
    (lambda r: arrival_times("gamma", rng=r, n=5, rate=1), "needs cv"),
])
def test_bad_arrival_parameters(call, message):
    with pytest.raises(InputError, match=message):
        call(np.random.default_rng(0))


# ---------------------------------------------------------------------- length specs

def test_length_specs_sample():
    rng = np.random.default_rng(0)
    assert parse_length("fixed:4").sample(rng, 3).tolist() == [4, 4, 4]
    u = parse_length("uniform:2:5", "seq_len").sample(rng, 50_000)
    assert u.dtype == np.int32 and set(np.unique(u)) == {2, 3, 4, 5}
    ln = parse_length("lognormal:1000:1", "input_tokens").sample(rng, 400_000)
    assert ln.min() >= 1 and ln.mean() == pytest.approx(1000, rel=0.02)
    assert np.median(ln) == pytest.approx(1000 * np.exp(-0.5), rel=0.02)
    assert parse_length("lognormal:3:0", "batch").sample(rng, 5).tolist() == [3] * 5


def test_resample_from_trace(tmp_path):
    p = tmp_path / "src.csv"
    save_trace(Trace.from_arrivals([0.0, 1.0, 2.0], input_tokens=[7, 8, 9], batch=[2, 2, 3]), p)
    d = parse_length(f"resample:{p}", "input_tokens")
    assert set(d.sample(np.random.default_rng(0), 1000).tolist()) == {7, 8, 9}
    d = parse_length(f"resample:{p}:batch", "batch")
    assert set(d.sample(np.random.default_rng(0), 1000).tolist()) == {2, 3}
    with pytest.raises(InputError, match="has no output_tokens column"):
        parse_length(f"resample:{p}", "output_tokens")


def test_resample_from_azure():
    path = SHARED / "azure_llm_2023_conv.csv"
    if not path.exists():
        pytest.skip(f"{path} not present")
    x = parse_length(f"resample:{path}:output_tokens", "output_tokens").sample(np.random.default_rng(0), 200_000)
    assert x.mean() == pytest.approx(211, rel=0.02)


@pytest.mark.parametrize("spec, column, message", [
    ("fixed", "batch", "fixed needs one value"),
    ("fixed:0", "batch", "V must be between 1"),
    ("fixed:x", "seq_len", "V 'x' is not a whole number"),
    ("fixed:1:2", "seq_len", "fixed needs one value"),
    ("uniform:5", "seq_len", "uniform needs two bounds"),
    ("uniform:5:2", "seq_len", "LO 5 is greater than HI 2"),
    ("uniform:0:2", "batch", "bounds must be between 1"),
    ("lognormal:100", "input_tokens", "needs MEAN and SIGMA"),
    ("lognormal:-1:1", "input_tokens", "MEAN must be > 0"),
    ("lognormal:100:-1", "input_tokens", "SIGMA must be >= 0"),
    ("lognormal:abc:1", "input_tokens", "MEAN 'abc' is not a number"),
    ("resample:", "input_tokens", "resample needs a trace file"),
    ("resample:/nonexistent/t.csv", "input_tokens", "no such file"),
    ("zipf:1.1", "input_tokens", "unknown distribution 'zipf'"),
    ("", "input_tokens", "unknown distribution"),
])
def test_bad_length_specs(spec, column, message):
    with pytest.raises(InputError, match=message) as e:
        parse_length(spec, column, name="--x")
    assert "\n" not in str(e.value)


def test_make_trace_dtypes():
    t = make_trace(np.array([0.1, 0.2]), rng=np.random.default_rng(0), batch="fixed:2",
                   output_tokens="uniform:1:3")
    assert t.batch.dtype == np.int32 and t.batch.tolist() == [2, 2]
    assert t.meta["batch"] == "fixed:2" and not t.input_tokens.any()


# ------------------------------------------------------------------------------- CLI

runner = CliRunner()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_cli_gen(tmp_path, suffix):
    out = tmp_path / f"g{suffix}"
    args = ["gen", "--arrival", "gamma", "--rate", "20", "--cv", "2", "--n", "1000",
            "--batch", "uniform:1:4", "--input-tokens", "lognormal:800:1", "--seed", "7", "--out", str(out)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert r.output.count("\n") == 1 and "wrote 1,000 requests" in r.output
    t = load_trace(out)
    assert len(t) == 1000 and t.batch.max() <= 4 and t.input_tokens.min() >= 1
    first = out.read_bytes()
    assert runner.invoke(app, args).exit_code == 0
    if suffix == ".csv":
        assert out.read_bytes() == first  # same seed, same file


@pytest.mark.parametrize("args, message", [
    (["--rate", "5", "--seed", "1"], "exactly one of --n or --duration-s"),
    (["--rate", "5", "--seed", "1", "--n", "5", "--batch", "uniform:0:3"], "--batch"),
    (["--arrival", "onoff", "--rate", "5", "--seed", "1", "--n", "5"], "needs on_s, off_s"),
])
def test_cli_gen_bad_input(tmp_path, args, message):
    r = runner.invoke(app, ["gen", "--out", str(tmp_path / "x.csv"), *args])
    assert isinstance(r.exception, InputError), r.output
    assert message in str(r.exception)
    assert not (tmp_path / "x.csv").exists()
