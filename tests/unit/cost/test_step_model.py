"""The step cost model: fitting, held-out error, padding, decode runs, extrapolation, bad files.

The synthetic step profile other tests use, tests/data/llm_steps_synthetic.{csv,json}, is
generated here from known coefficients (``python tests/unit/cost/test_step_model.py`` rewrites it) and
a test checks the committed files still equal what this generator writes.
"""

from __future__ import annotations

import itertools
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from schedsim.errors import InputError
from schedsim.cost.step_fit import (FEATURES, StepFit, feature_matrix, fit_step_profile, heldout_rows,
                                    save_step_profile)
from schedsim.cost.step_model import ContextExtrapolationWarning, StepCostModel
from schedsim.cost.step_profile import COLUMNS, StepProfile, load_step_profile
from schedsim.cost.llm_shapes import CUDA_GRAPH_BATCH_SIZES

from step_profile_synthetic import (SYNTHETIC, SYNTHETIC_META, TRUE_COEF, compositions, synthetic_columns,  # noqa: E402,F401
                                   synthetic_profile, write_synthetic)


@pytest.fixture(scope="module")
def model() -> StepCostModel:
    return StepCostModel.from_profile(load_step_profile(SYNTHETIC), bytes_per_block=16 * 32768)


# ----------------------------------------------------------------------------- fitting

def test_fit_recovers_known_coefficients():
    fit = fit_step_profile(synthetic_profile())
    np.testing.assert_allclose(fit.coefficients, TRUE_COEF, rtol=1e-6)
    assert fit.mape_pct < 1e-6 and fit.max_abs_err_pct < 1e-6 and fit.train_mape_pct < 1e-6
    assert fit.n_heldout > 0 and fit.n_train + fit.n_heldout == len(compositions())


def test_heldout_split_is_disjoint_deterministic_and_unseen_by_the_fit():
    prof = synthetic_profile()
    a, b = fit_step_profile(prof), fit_step_profile(prof)
    np.testing.assert_array_equal(a.heldout, heldout_rows(len(prof)))
    np.testing.assert_array_equal(a.heldout, b.heldout)
    np.testing.assert_array_equal(a.coefficients, b.coefficients)
    assert list(np.flatnonzero(a.heldout)[:3]) == [4, 9, 14]
    # Corrupting held-out rows changes the reported error, not the coefficients.
    cols = synthetic_columns()
    cols["latency_ms_mean"] = np.where(a.heldout, cols["latency_ms_mean"] * 1.1, cols["latency_ms_mean"])
    for p in ("latency_ms_p50", "latency_ms_p90", "latency_ms_p99"):
        cols[p] = np.maximum(cols[p], cols["latency_ms_mean"] * (1.0 if p == "latency_ms_p50" else 1.2))
    c = fit_step_profile(StepProfile.from_columns(cols, SYNTHETIC_META))
    np.testing.assert_allclose(c.coefficients, TRUE_COEF, rtol=1e-6)
    assert c.mape_pct == pytest.approx(100 / 11, rel=1e-6)
    assert c.train_mape_pct < 1e-6


def test_fit_meta_names_features_and_split():
    meta = fit_step_profile(synthetic_profile()).to_dict()
    assert meta["features"] == list(FEATURES)
    assert set(meta["coefficients_ms"]) == set(FEATURES)
    for key in ("mape_pct", "max_abs_err_pct", "n_train", "n_heldout", "split"):
        assert key in meta


def test_fit_a_csv_with_settings_before_its_sidecar_exists(tmp_path):
    """The profiler fits the CSV it just wrote, passing the sidecar it is about to write."""
    path = save_step_profile(synthetic_profile(), tmp_path / "p.csv").path
    path.with_suffix(".json").write_text("{ stale and broken")
    meta = {"schema": "schedsim.step_profile/1", "block_size": 16, "step_overhead_us": None,
            "swap_gb_per_s": None, "provenance": {"cuda_graphs": True}, "max_context_measured": 32001}
    fit = fit_step_profile(path, meta)
    np.testing.assert_allclose(fit.coefficients, TRUE_COEF, rtol=1e-6)
    json.dumps(fit.to_dict())


def test_provenance_cuda_graphs_false_means_no_graphs():
    cols = synthetic_columns(graph_sizes=())
    prof = StepProfile.from_columns(cols, {"provenance": {"cuda_graphs": False}, "step_overhead_us": None})
    assert prof.cuda_graph_batch_sizes == ()
    m = StepCostModel.from_profile(prof)
    np.testing.assert_allclose(m.fit.coefficients[10:], TRUE_COEF[10:], rtol=1e-6)
    assert m.overhead_ns == 0.0


def test_too_few_rows_to_fit():
    cols = {k: v[:4] for k, v in synthetic_columns().items()}
    with pytest.raises(InputError, match="too few"):
        fit_step_profile(cols)


# ----------------------------------------------------------------------------- pricing

def test_step_ns_prices_profile_rows_as_the_fit_does(model):
    """step_ns on real Step arrays and the fitting matrix agree, row by row: one feature definition."""
    prof = model.profile
    pred_ms = feature_matrix(prof.columns, prof.block_size, prof.cuda_graph_batch_sizes) @ model.fit.coefficients
    for i in range(len(prof)):
        ps, pc, pctx, ds, dctx = (int(prof.columns[c][i]) for c in COLUMNS[:5])
        num = np.array([pc] * ps + [1] * ds, dtype=np.int32)
        ctx = np.array([pctx] * ps + [dctx] * ds, dtype=np.int32)
        got = model.step_ns(num, ctx)
        assert got == pytest.approx(pred_ms[i] * 1e6 + 50_000, rel=1e-12, abs=1)


def test_decode_padding_to_graph_batch():
    prof = synthetic_profile()
    coef = np.zeros(len(FEATURES))
    coef[FEATURES.index("graph_batch")] = 0.01  # pure padding: 0.01 ms per padded sequence
    fit = StepFit(coef, 0.0, 0.0, 0.0, 1, 1, heldout_rows(len(prof)))
    m = StepCostModel(prof, fit)
    ones = np.ones(8, np.int32)
    ctx = np.full(8, 100, np.int32)
    t = [m.step_ns(ones[:n], ctx[:n]) for n in range(1, 9)]
    assert t[2] == t[3] == round(4 * 0.01 * 1e6 + 50_000)  # 3 and 4 both run as a batch of 4
    assert t[4] == t[7] == round(8 * 0.01 * 1e6 + 50_000)
    assert t[0] < t[1] < t[3] < t[7]


def test_fitted_model_pads_decode_batches(model):
    ctx = np.full(5, 1000, np.int32)
    ones = np.ones(5, np.int32)
    assert model.step_ns(ones[:3], ctx[:3]) == model.step_ns(ones[:4], ctx[:4])
    assert model.step_ns(ones[:5], ctx[:5]) > model.step_ns(ones[:4], ctx[:4])


def test_graph_width_is_a_power_of_two_blocks(model):
    one = np.ones(1, np.int32)
    # 16 blocks of 16 tokens minimum; contexts 0..255 (+1 new token) share one width.
    assert model.step_ns(one, np.array([0], np.int32)) == model.step_ns(one, np.array([255], np.int32))
    assert model.step_ns(one, np.array([256], np.int32)) > model.step_ns(one, np.array([255], np.int32))


def test_no_graphs_prices_decodes_eagerly():
    meta = dict(SYNTHETIC_META, cuda_graphs=False)
    prof = StepProfile.from_columns(synthetic_columns(graph_sizes=()), meta)
    m = StepCostModel.from_profile(prof)
    np.testing.assert_allclose(m.fit.coefficients[:10], 0.0)
    np.testing.assert_allclose(m.fit.coefficients[10:], TRUE_COEF[10:], rtol=1e-6)
    ones, ctx = np.ones(4, np.int32), np.full(4, 100, np.int32)
    assert m.step_ns(ones[:3], ctx[:3]) < m.step_ns(ones, ctx)


@settings(max_examples=150, deadline=None)
@given(ctx=st.lists(st.integers(0, 40_000), min_size=1, max_size=300), k=st.integers(1, 400),
       graphs=st.booleans())
def test_decode_run_equals_looped_steps_bit_for_bit(ctx, k, graphs):
    m = _models()[graphs]
    context = np.array(ctx, dtype=np.int32)
    ones = np.ones(context.size, np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextExtrapolationWarning)
        run = m.decode_run_ns(context, k)
        loop = [m.step_ns(ones, context + j) for j in range(k)]
    assert run.dtype == np.int64 and run.tolist() == loop


def test_decode_run_of_ten_thousand_steps(model):
    context = np.arange(0, 4000, 40, dtype=np.int32)
    run = model.decode_run_ns(context, 10_000)
    assert run.shape == (10_000,) and (np.diff(run) >= 0).all()
    assert run[-1] == model.step_ns(np.ones(100, np.int32), context + 9_999)


def test_decode_run_beyond_the_largest_graph_runs_eagerly(model):
    context = np.arange(300, dtype=np.int32) * 7
    ones = np.ones(300, np.int32)
    assert model.decode_run_ns(context, 50).tolist() == [model.step_ns(ones, context + j) for j in range(50)]
    assert model.step_ns(ones, context) > model.step_ns(ones[:256], context[:256])


_MODELS: dict = {}


def _models():
    if not _MODELS:
        _MODELS[True] = StepCostModel.from_profile(synthetic_profile())
        prof = StepProfile.from_columns(synthetic_columns(graph_sizes=()), dict(SYNTHETIC_META, cuda_graphs=False))
        _MODELS[False] = StepCostModel.from_profile(prof)
    return _MODELS


def test_context_extrapolation_warns_once():
    m = StepCostModel.from_profile(synthetic_profile())
    assert m.max_context_measured == 32001
    one = np.ones(1, np.int32)
    short = m.step_ns(one, np.array([32000], np.int32))
    assert not m.extrapolated
    with pytest.warns(ContextExtrapolationWarning) as rec:
        long = m.step_ns(one, np.array([190_000], np.int32))
        m.step_ns(np.array([4096], np.int32), np.array([190_000], np.int32))
        m.decode_run_ns(np.array([200_000], np.int32), 5)
    assert len(rec) == 1 and m.extrapolated and long > short
    strict = StepCostModel.from_profile(synthetic_profile(), extrapolate_context=False)
    with pytest.raises(InputError, match="measured contexts up to 32001"):
        strict.step_ns(one, np.array([190_000], np.int32))


def test_mixed_step_terms(model):
    """A prefill chunk's cost grows with its cached context; decodes in a mixed step add their KV."""
    q = np.array([512], np.int32)
    a = model.step_ns(q, np.array([0], np.int32))
    b = model.step_ns(q, np.array([8192], np.int32))
    assert b - a == pytest.approx((TRUE_COEF[13] * 512 * 8192 + TRUE_COEF[14] * 8192) * 1e6, rel=1e-5)
    c = model.step_ns(np.array([512, 1, 1], np.int32), np.array([0, 100, 5000], np.int32))
    kv = 2 * (-(-5001 // 16) * 16)
    # Two decodes beside the chunk: two more tokens, two decode rows, their KV, and the
    # decode-attention path that any decodes in an eager step bring (once).
    assert c - a == pytest.approx((2 * TRUE_COEF[11] + 2 * TRUE_COEF[15] + kv * TRUE_COEF[16] + TRUE_COEF[17]) * 1e6,
                                  rel=1e-5)


def test_swap_cost(model):
    one, ctx = np.ones(1, np.int32), np.array([10], np.int32)
    base = model.step_ns(one, ctx)
    # 10 blocks of 512 KiB at 25 GB/s
    assert model.step_ns(one, ctx, swap_blocks=10) - base == pytest.approx(10 * 16 * 32768 / 25.0, abs=1)
    meta = {k: v for k, v in SYNTHETIC_META.items() if k != "swap_gb_per_s"}
    m = StepCostModel.from_profile(StepProfile.from_columns(synthetic_columns(), meta), bytes_per_block=1024)
    with pytest.raises(InputError, match="swap_gb_per_s"):
        m.step_ns(one, ctx, swap_blocks=1)


# ----------------------------------------------------------------------------- files

def test_committed_synthetic_profile_matches_generator(tmp_path):
    fresh = write_synthetic(tmp_path / "s.csv")
    committed = load_step_profile(SYNTHETIC)
    assert committed.meta["synthetic"] is True and "tests only" in committed.meta["note"]
    assert "profiles" not in SYNTHETIC.parts
    for c in COLUMNS:
        np.testing.assert_array_equal(committed.columns[c], fresh.columns[c])
    assert committed.meta["fit"]["n_heldout"] == fresh.meta["fit"]["n_heldout"]
    assert committed.meta["fit"]["mape_pct"] < 1e-6


def _write(tmp_path, text, meta=None):
    p = tmp_path / "steps.csv"
    p.write_text(text)
    if meta is not None:
        p.with_suffix(".json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    return p


HEADER = ",".join(COLUMNS)
ROW = "0,0,0,4,100,1.0,1.0,1.1,1.2,0.01,50"


@pytest.mark.parametrize("text, expect", [
    ("prefill_seqs,decode_seqs\n1,2\n", r"steps.csv:1: prefill_chunk: missing required column"),
    (f"{HEADER}\n{ROW}\n0,0,0,x,100,1.0,1.0,1.1,1.2,0.01,50\n", r"steps.csv:3: decode_seqs: 'x' is not a finite number"),
    (f"{HEADER}\n{ROW}\n0,0,0,4,100,1.0,1.0,1.1\n", r"steps.csv:3: 8 fields, the header has 11"),
    (f"{HEADER}\n0,0,0,2.5,100,1.0,1.0,1.1,1.2,0.01,50\n", r"steps.csv:2: decode_seqs: 2.5 is not an integer"),
    (f"{HEADER}\n0,0,0,-1,100,1.0,1.0,1.1,1.2,0.01,50\n", r"steps.csv:2: decode_seqs: -1 must be >= 0"),
    (f"{HEADER}\n0,0,0,4,100,0,1.0,1.1,1.2,0.01,50\n", r"steps.csv:2: latency_ms_mean: 0 must be > 0"),
    (f"{HEADER}\n0,0,0,4,100,1.0,1.0,0.9,1.2,0.01,50\n", r"steps.csv:2: latency_ms_p90: 0.9 is below latency_ms_p50"),
    (f"{HEADER}\n0,0,0,0,100,1.0,1.0,1.1,1.2,0.01,50\n", r"steps.csv:2: decode_seqs: a step needs"),
    (f"{HEADER}\n1,1,0,0,0,1.0,1.0,1.1,1.2,0.01,50\n", r"steps.csv:2: prefill_chunk: 1 must be >= 2"),
    (f"{HEADER}\n{ROW}\n\n{ROW}\n", r"steps.csv:4: prefill_seqs: duplicate step composition \(first at line 2\)"),
    (f"{HEADER}\n", r"header but no rows"),
    ("", r"steps.csv:1: empty step profile"),
    (f"{HEADER},n\n", r"steps.csv:1: n: column appears more than once"),
])
def test_bad_profile_csv(tmp_path, text, expect):
    with pytest.raises(InputError, match=expect):
        load_step_profile(_write(tmp_path, text))


@pytest.mark.parametrize("meta, expect", [
    ({"block_size": 0}, r"steps.json: block_size: 0 must be an integer >= 1"),
    ({"cuda_graph_batch_sizes": [4, 2]}, r"steps.json: cuda_graph_batch_sizes"),
    ({"swap_gb_per_s": -1}, r"steps.json: swap_gb_per_s"),
    ({"step_overhead_us": "x"}, r"steps.json: step_overhead_us"),
    ({"schema": "other/1"}, r"steps.json: schema"),
    ("{\n  \"block_size\": 16,\n}", r"steps.json:3: invalid JSON"),
    ("[1]", r"steps.json: sidecar must be a JSON object"),
])
def test_bad_sidecar(tmp_path, meta, expect):
    with pytest.raises(InputError, match=expect):
        load_step_profile(_write(tmp_path, f"{HEADER}\n{ROW}\n", meta))


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such step profile"):
        load_step_profile(tmp_path / "nope.csv")


def test_save_and_load_round_trip(tmp_path):
    prof = synthetic_profile()
    back = save_step_profile(prof, tmp_path / "x.csv")
    for c in COLUMNS:
        np.testing.assert_array_equal(back.columns[c], prof.columns[c])
    assert back.meta["schema"] == "schedsim.step_profile/1" and "fit" in back.meta


if __name__ == "__main__":
    if len(sys.argv) > 1:
        raise SystemExit("usage: python tests/unit/cost/test_step_model.py  (rewrites tests/data/llm_steps_synthetic.*)")
    p = write_synthetic()
    print(f"wrote {SYNTHETIC} ({len(p)} rows) and its sidecar")


def test_sidecar_fit_is_reused_only_for_the_same_table(tmp_path):
    """A sidecar fit made from this table is taken as it is (no scipy at run time); an
    edited table is refitted."""
    from schedsim.cost.step_fit import stored_fit

    path = save_step_profile(synthetic_profile(), tmp_path / "p.csv").path
    prof = load_step_profile(path)
    fit = stored_fit(prof)
    assert fit is not None
    np.testing.assert_array_equal(fit.coefficients, fit_step_profile(prof).coefficients)
    lines = path.read_text().splitlines()
    head, first = lines[0], lines[1].split(",")
    first[5] = str(float(first[5]) * 2)   # latency_ms_mean of the first row
    path.write_text("\n".join([head, ",".join(first), *lines[2:]]) + "\n")
    assert stored_fit(load_step_profile(path)) is None


def test_a_host_overhead_column_is_fitted_with_the_step_instead_of_one_constant(tmp_path):
    """With host_overhead_ms_p50 the model prices forward pass plus host time per composition
    and adds no step_overhead_us; without it, the constant is added as before."""
    from schedsim.cost.step_profile import HOST_COLUMN

    src = load_step_profile(SYNTHETIC)
    cols = dict(src.columns)
    # Host work that grows with the rows packed: 0.2 ms + 4 us per row.
    rows = cols["prefill_seqs"] + cols["decode_seqs"]
    cols[HOST_COLUMN] = 0.2 + 0.004 * rows
    meta = dict(src.meta) | {"step_overhead_us": 5000.0}
    meta.pop("fit", None)
    with_host = StepProfile.from_columns(cols, meta)
    fit = fit_step_profile(with_host)
    assert fit.includes_host and fit.target == f"latency_ms_mean + {HOST_COLUMN}"
    model = StepCostModel(with_host, fit)
    assert model.overhead_ns == 0.0
    plain = StepCostModel(src, fit_step_profile(src))
    assert plain.overhead_ns == src.meta.get("step_overhead_us", 0.0) * 1e3
    # The saved profile keeps the column, and its stored fit is found again on load.
    out = tmp_path / "host.csv"
    save_step_profile(with_host, out)
    again = load_step_profile(out)
    assert HOST_COLUMN in again.columns and np.array_equal(again.columns[HOST_COLUMN], with_host.columns[HOST_COLUMN])
    assert again.meta["fit"]["target"] == fit.target
    # The host time is in the fitted steps: a one-row decode costs about 0.2 ms more than
    # without the column (and not the 5 ms constant).
    one = dict(graph=1, padded=1, width=16 * 16)
    with_h = StepCostModel.from_profile(again)
    assert with_h.overhead_ns == 0.0
    delta = _decode_ms(with_h, **one) - _decode_ms(StepCostModel(StepProfile.from_columns(dict(src.columns), meta),
                                                                 fit_step_profile(src)), **one) + 5.0
    assert 0.1 < delta < 0.35


def test_a_bad_host_overhead_value_names_its_line_and_column(tmp_path):
    from schedsim.cost.step_profile import HOST_COLUMN

    lines = SYNTHETIC.read_text().splitlines()
    lines[0] += f",{HOST_COLUMN}"
    lines[1:] = [l + ",0.3" for l in lines[1:]]
    lines[2] = lines[2][:-3] + "-1"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=rf"bad.csv:3.*{HOST_COLUMN}.*>= 0"):
        load_step_profile(bad)


def _decode_ms(model, *, graph, padded, width) -> float:
    """The model's time of one graph decode step of ``padded`` rows at ``width`` tokens, ms."""
    from schedsim.cost.step_fit import step_features

    f = step_features(np.array([graph]), np.array([padded]), np.array([width]), *([np.array([0])] * 5),
                      np.array([0]))
    return float(sum(c * float(np.asarray(v)[0]) for c, v in zip(model._coef, f))) + model.overhead_ns / 1e6
