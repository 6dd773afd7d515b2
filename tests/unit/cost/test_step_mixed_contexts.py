"""Decode rows with mixed contexts (the real-KV term) and fresh prefill shapes in the step profiler.

Predictions of old-format profiles are pinned to what the cost model gave before the
``decode_kv_tokens`` column existed (recorded with that version, 2026-11-30).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from schedsim.errors import InputError
from schedsim.cost.step_fit import (FEATURES, KV_FEATURE, feature_matrix, fit_step_profile, real_kv_tokens,
                                    save_step_profile, stored_fit)
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import (COLUMNS, FIRST_CALL_KEY, FRESH_COLUMN, KV_COLUMN, StepProfile,
                                        load_step_profile)
from schedsim.cost.llm_shapes import CUDA_GRAPH_BATCH_SIZES

from step_profile_synthetic import SYNTHETIC, SYNTHETIC_META, TRUE_COEF, compositions, synthetic_columns

CASES = [([1], [100]), ([1] * 3, [10, 500, 4000]), ([1] * 32, list(range(0, 32000, 1000))),
         ([1] * 300, [7 * i for i in range(300)]), ([512], [0]), ([2048, 1, 1, 1], [8000, 100, 5000, 900]),
         ([16] + [1] * 60, [37 * i for i in range(61)])]
PREVIOUS_PROFILE = Path(__file__).resolve().parents[3] / "tests" / "data" / "llama-1b-bf16-h200-steps-previous.csv"
EAGER_DECODE_STEP_NS = int(TRUE_COEF[17] * 1e6)
OVER_KNEE_NS = int(TRUE_COEF[18] * 1e6) * (2051 - 1024)   # case 5: 2,048 + 3 tokens
BEFORE = {  # step_ns of CASES, and the sum of a 200-step decode run, before the real-KV term
    # With the eager_decode_step and knee features the eager steps with decode rows (cases 3, 5 and 6: 300
    # decodes, and a chunk beside decodes) pay eager_decode_step's synthetic 2 ms once, and
    # case 5 (2,051 tokens) its tokens beyond the 1,024-token knee.
    "synthetic": ([855072, 1021840, 9302608, 8080400 + EAGER_DECODE_STEP_NS, 3705784,
                   18219349 + EAGER_DECODE_STEP_NS + OVER_KNEE_NS, 3031580 + EAGER_DECODE_STEP_NS], 221407360),
    # Refitted with eager_decode_step and eager_tokens_over_knee: graph steps price as
    # before, eager ones moved (were 33252542, 9996194, 24033997, 13809660).
    "committed": ([2367520, 3240276, 37783926, 31962912, 8780536, 25496114, 15834654], 738787088,
                  "86d93e198dcca986"),
}


def _prices(model):
    steps = [model.step_ns(np.array(q, np.int32), np.array(c, np.int32)) for q, c in CASES]
    return steps, int(model.decode_run_ns(np.array([10, 500, 4000], np.int32), 200).sum())


def test_old_format_profiles_price_as_before():
    model = StepCostModel.from_profile(load_step_profile(SYNTHETIC))
    assert model.fit.features == FEATURES
    assert _prices(model) == BEFORE["synthetic"]


def test_previous_committed_profile_prices_as_before():
    # The profile committed before the re-measurement with decode_kv_tokens, kept for comparison.
    prof = load_step_profile(PREVIOUS_PROFILE)
    assert KV_COLUMN not in prof.columns
    model = StepCostModel.from_profile(prof)
    steps, run, digest = BEFORE["committed"]
    assert model.fit.table_sha256.startswith(digest)
    assert stored_fit(prof) is None      # its sidecar's fit predates eager_decode_step: refitted on load
    assert _prices(model) == (steps, run)


# -- the real-KV term ---------------------------------------------------------------------

KV_TRUE = np.append(TRUE_COEF, 6e-6)   # ms per real KV token read (the rounded mean)


def _spread(n, lo, hi, power):
    return [int(c) for c in np.round(lo + (hi - lo) * np.linspace(0, 1, n) ** power)]


def mixed_columns(coef=KV_TRUE):
    """The synthetic compositions with decode_kv_tokens, plus decodes with mixed contexts."""
    rows = [(*r, r[3] * (r[4] + 1)) for r in compositions()]
    for n in (4, 16, 32, 64, 128, 256, 300):
        for lo, hi, power in ((100, 2000, 1), (100, 8000, 1), (100, 8000, 3), (16, 32000, 3)):
            ctx = _spread(n, lo, hi, power)
            rows.append((0, 0, 0, n, max(ctx), sum(ctx) + n))
            if n in (32, 128):
                rows.append((1, 512, 0, n, max(ctx), sum(ctx) + n))
    cols = {c: np.array([r[i] for r in rows], np.int64) for i, c in enumerate(COLUMNS[:5])}
    cols[KV_COLUMN] = np.array([r[5] for r in rows], np.int64)
    mean = feature_matrix(cols, 16, CUDA_GRAPH_BATCH_SIZES) @ coef
    cols.update(latency_ms_mean=mean, latency_ms_p50=mean, latency_ms_p90=mean * 1.02,
                latency_ms_p99=mean * 1.05, latency_ms_std=mean * 0.01, n=np.full(len(rows), 50, np.int64))
    return cols


@pytest.fixture(scope="module")
def mixed_model() -> StepCostModel:
    return StepCostModel.from_profile(StepProfile.from_columns(mixed_columns(), SYNTHETIC_META))


def test_fit_recovers_the_real_kv_coefficient(mixed_model):
    fit = mixed_model.fit
    assert fit.features == FEATURES + (KV_FEATURE,)
    assert fit.mape_pct < 1e-3
    np.testing.assert_allclose(fit.coefficients, KV_TRUE, rtol=1e-3, atol=1e-9)


def test_mixed_batch_costs_less_than_its_padded_width(mixed_model):
    ones = np.ones(32, np.int32)
    uniform = mixed_model.step_ns(ones, np.full(32, 8000, np.int32))
    mixed = np.array(_spread(32, 100, 8000, 3), np.int32)
    skew = mixed_model.step_ns(ones, mixed)
    real_saved = KV_TRUE[-1] * (real_kv_tokens(32, 32 * 8001, 16) - real_kv_tokens(32, int(mixed.sum()) + 32, 16))
    assert uniform - skew == pytest.approx(real_saved * 1e6, abs=2)
    # Without the column the same table prices both alike: only the padded width counts.
    cols = {k: v for k, v in mixed_columns().items() if k != KV_COLUMN}
    keep = np.flatnonzero(cols["decode_seqs"] * (cols["decode_context"] + 1) == mixed_columns()[KV_COLUMN])
    plain = StepCostModel.from_profile(StepProfile.from_columns({k: v[keep] for k, v in cols.items()}, SYNTHETIC_META))
    assert plain.step_ns(ones, np.full(32, 8000, np.int32)) == plain.step_ns(ones, mixed)


@pytest.mark.parametrize("n,lo,hi,k", [(3, 10, 500, 700), (20, 1, 3000, 2500), (64, 5, 70, 3000), (300, 0, 9000, 600)])
def test_decode_run_with_real_kv_equals_looped_steps(mixed_model, n, lo, hi, k):
    context = np.array(_spread(n, lo, hi, 2), np.int32)
    ones = np.ones(n, np.int32)
    counts, prices = mixed_model.decode_run_segments(context, k)
    assert sum(counts) == k and len(prices) < k / 8        # one price per stretch, not per step
    assert mixed_model.decode_run_ns(context, k).tolist() == [mixed_model.step_ns(ones, context + j)
                                                             for j in range(k)]


def test_real_kv_tokens_scalar_and_array_agree():
    n = np.array([1, 3, 32, 0, 7], np.int64)
    for kv in range(0, 40000, 13):
        arr = real_kv_tokens(n, np.where(n > 0, n * (kv + 1), 0), 16)
        assert arr.tolist() == [real_kv_tokens(int(d), int(d) * (kv + 1), 16) for d in n]


def test_kv_column_round_trips_and_is_validated(tmp_path):
    saved = save_step_profile(StepProfile.from_columns(mixed_columns(), SYNTHETIC_META), tmp_path / "kv.csv")
    assert saved.columns[KV_COLUMN].tolist() == mixed_columns()[KV_COLUMN].tolist()
    assert stored_fit(saved) is not None and stored_fit(saved).features[-1] == KV_FEATURE
    assert json.loads((tmp_path / "kv.json").read_text())["fit"]["features"][-1] == KV_FEATURE
    cols = mixed_columns()
    cols[KV_COLUMN] = cols[KV_COLUMN].copy()
    i = int(np.flatnonzero(cols["decode_seqs"] == 4)[0])
    cols[KV_COLUMN][i] = 4 * (cols["decode_context"][i] + 1) + 1   # more than every row at the longest
    with pytest.raises(InputError, match=KV_COLUMN):
        StepProfile.from_columns(cols, SYNTHETIC_META)


def test_same_longest_context_different_kv_tokens_are_distinct_rows():
    cols = mixed_columns()
    key = list(zip(*(cols[c].tolist() for c in COLUMNS[:5])))
    assert len(set(key)) < len(key)          # the table has such pairs, and it loads
    assert len(fit_step_profile(cols).coefficients) == len(FEATURES) + 1


# -- the profiler ------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def _profile(tmp_path, comps, **kw):
    from schedsim.profiling.step_profiler import StepProfileSpec, run_step_profile

    spec = StepProfileSpec(model="builtin:llama-tiny", dtype="fp32", device="cpu", compositions=tuple(comps),
                           warmup_calls=1, min_samples=6, max_time_s=30, visit_ms=1e-6, swap_blocks=8, **kw)
    out = tmp_path / "p.csv"
    run_step_profile(spec, out)
    return load_step_profile(out), json.loads(out.with_suffix(".json").read_text())


def test_profile_writes_mixed_contexts_with_their_real_kv_tokens(tmp_path):
    from schedsim.profiling.step_grid import Composition

    comps = [Composition(decode_seqs=4, decode_context=100), Composition.spread(8, 16, 300),
             Composition.spread(8, 16, 300, 3), Composition.spread(4, 20, 200, 1, (1, 24, 0))]
    prof, meta = _profile(tmp_path, comps, fresh_shapes=False)
    c = prof.columns
    assert c["decode_context"].tolist() == [100, 300, 300, 200]
    expected = [4 * 101, sum(_spread(8, 16, 300, 1)) + 8, sum(_spread(8, 16, 300, 3)) + 8,
                sum(_spread(4, 20, 200, 1)) + 4]
    assert c[KV_COLUMN].tolist() == expected
    assert meta["sampling"]["shapes"] == "warm" and meta["sampling"]["fresh_shapes"]["fresh_samples"] == 0


class _Calls:
    """Token counts of every step the engine runs, in order."""

    def __init__(self, monkeypatch):
        from schedsim.live.engines.llm_engine import PagedLLMEngine

        self.tokens: list[tuple[int, ...]] = []
        real = PagedLLMEngine.execute

        def execute(engine, rows):
            self.tokens.append(tuple(len(r.tokens) for r in rows))
            return real(engine, rows)

        monkeypatch.setattr(PagedLLMEngine, "execute", execute)
        # Where the profiler's first-call phase starts (after the sampling), if it runs.
        import schedsim.profiling.step_profiler as profiler

        self.first_call_phase: int | None = None
        first_calls = profiler._first_calls

        def mark(*args, **kwargs):
            self.first_call_phase = len(self.tokens)
            return first_calls(*args, **kwargs)

        monkeypatch.setattr(profiler, "_first_calls", mark)

    def new_prefill_steps(self, before: int | None = None) -> int:
        """Steps with a prefill chunk whose token count no step had before (among the first ``before``)."""
        seen, new = set(), 0
        for t in self.tokens[:before]:
            if max(t) > 1 and sum(t) not in seen:
                new += 1
            seen.add(sum(t))
        return new


@pytest.mark.parametrize("fresh", [True, False])
def test_fresh_shapes_give_every_prefill_sample_a_new_length(tmp_path, monkeypatch, fresh):
    from schedsim.profiling.step_grid import Composition

    calls = _Calls(monkeypatch)
    comps = [Composition(1, 64, 0), Composition(1, 64, 100), Composition(2, 40, 0),
             Composition(1, 48, 0, 3, 50), Composition(decode_seqs=2, decode_context=30)]
    prof, meta = _profile(tmp_path, comps, fresh_shapes=fresh)
    c = prof.columns
    prefill = c["prefill_seqs"] > 0
    samples = int(c["n"][prefill].sum())
    nominal = {p.tokens for p in comps if p.prefill_seqs}
    record = meta["sampling"]["fresh_shapes"]
    assert c["prefill_chunk"].tolist() == [64, 64, 40, 48, 0]     # the CSV keeps the nominal chunks
    if fresh:
        # Every sample of a prefill step ran a token count the engine had not run before (then
        # the first-call phase runs its own, test_the_first_call_phase_times_new_counts_twice).
        assert calls.new_prefill_steps(before=calls.first_call_phase) == len(nominal) + samples
        assert c[FRESH_COLUMN][prefill].tolist() == c["n"][prefill].tolist()
        assert record["fresh_samples"] == samples and record["warm_samples"] == 0
        assert record["mean_move_tokens_max_abs"] <= 1.0         # moves alternate around the nominal chunk
        assert meta["sampling"]["shapes"] == "fresh"
    else:
        assert calls.new_prefill_steps() == len(nominal)
        assert {sum(t) for t in calls.tokens if max(t) > 1} == nominal
        assert record["fresh_samples"] == 0


def test_the_first_call_phase_times_new_counts_twice(tmp_path, monkeypatch):
    from schedsim.profiling.step_profiler import FIRST_CALL_STEPS
    from schedsim.profiling.step_grid import Composition

    calls = _Calls(monkeypatch)
    prof, meta = _profile(tmp_path, [Composition(1, 64, 0), Composition(1, 48, 0, 3, 50)])
    start = calls.first_call_phase
    phase = calls.tokens[start:start + 2 * FIRST_CALL_STEPS]
    assert start is not None and len(phase) == 2 * FIRST_CALL_STEPS and all(a == b for a, b in zip(phase[::2], phase[1::2]))
    before = {sum(t) for t in calls.tokens[:start]}
    firsts = [sum(t) for t in phase[::2]]
    assert firsts[0] not in before                       # a count no step had run
    record = meta[FIRST_CALL_KEY]
    assert record["steps"] == FIRST_CALL_STEPS and record["ms"] >= 0
    assert record["priced"] is False and prof.first_call_ms is None     # measured, not priced
    priced = StepProfile(prof.columns, dict(prof.meta, **{FIRST_CALL_KEY: dict(record, priced=True)}))
    assert priced.first_call_ms == record["ms"]


def _first_call_model(ms: float) -> StepCostModel:
    cols = dict(synthetic_columns())
    prefill = np.asarray(cols["prefill_seqs"]) > 0
    cols[FRESH_COLUMN] = np.where(prefill, np.asarray(cols["n"]), 0)   # every prefill sample at a new count
    meta = dict(SYNTHETIC_META, **{FIRST_CALL_KEY: {"ms": ms, "priced": True}})
    return StepCostModel.from_profile(StepProfile.from_columns(cols, meta))


def test_a_priced_first_call_is_charged_once_per_new_token_count_and_each_run_starts_afresh():
    plain, model = _first_call_model(0.0), _first_call_model(0.5)   # the synthetic prefills take 1.6 ms and more
    prefill = (np.array([300, 1, 1]), np.array([0, 40, 90]))
    assert model.first_call_ns == 0.5e6 and plain.first_call_ns == 0.0
    model.begin_run()
    first, again = model.step_ns(*prefill), model.step_ns(*prefill)
    assert first - again == 500_000
    plain.begin_run()
    assert plain.step_ns(*prefill) == plain.step_ns(*prefill)    # 0 ms: no first-call term
    decode = (np.ones(3, dtype=np.int64), np.array([40, 90, 10]))
    assert model.step_ns(*decode) == model.step_ns(*decode)     # decode-only steps pay nothing
    model.warm_tokens = frozenset({302})
    model.begin_run()
    assert model.step_ns(*prefill) == again                      # the warm-up ran this count


def test_a_first_call_longer_than_a_step_is_refused():
    with pytest.raises(InputError, match=r"row \d+: first_call.ms 1e\+06 is more than"):
        _first_call_model(1e6)


def test_the_simulator_starts_every_run_with_the_warm_counts():
    from schedsim.live.llm_warmup import warm_token_counts

    counts = warm_token_counts(block_size=16, num_blocks=4096, max_context=8192, graph_batch_sizes=(1, 2, 4, 8),
                               max_seqs=16, prefill_tokens=2048)
    assert {2048, 1024, 16} <= counts and all(isinstance(c, int) for c in counts)
    model = _first_call_model(0.5)
    model.warm_tokens = counts
    model.seen_tokens = {1, 2, 3}
    model.begin_run()
    assert model.seen_tokens == set(counts)


@pytest.mark.parametrize("value, field", [({"ms": -1}, "first_call.ms"), ({"priced": True}, "first_call.ms"),
                                          ({"ms": 1.0, "priced": "yes"}, "first_call.priced")])
def test_a_bad_first_call_names_its_field(value, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        StepProfile.from_columns(synthetic_columns(), dict(SYNTHETIC_META, first_call=value))


def test_a_bad_fresh_samples_value_names_its_line(tmp_path):
    cols = dict(synthetic_columns())
    cols[FRESH_COLUMN] = np.asarray(cols["n"]) + 1
    with pytest.raises(InputError, match=r"fresh_samples: row 0: .51. must be an integer from 0 to n \(50\)"):
        StepProfile.from_columns(cols, SYNTHETIC_META)


def test_warm_shapes_measure_no_first_call(tmp_path):
    from schedsim.profiling.step_grid import Composition

    prof, meta = _profile(tmp_path, [Composition(1, 64, 0)], fresh_shapes=False)
    assert meta[FIRST_CALL_KEY] is None and prof.first_call_ms is None
    assert prof.columns[FRESH_COLUMN].tolist() == [0]


def test_fresh_shapes_fall_back_to_the_nominal_shape_when_the_band_is_used_up(tmp_path, monkeypatch):
    from schedsim.profiling.step_profiler import jitter_tokens
    from schedsim.profiling.step_grid import Composition

    calls = _Calls(monkeypatch)
    comps = [Composition(1, 10, c) for c in (0, 20, 40)]   # one token count, a band of +-8
    prof, meta = _profile(tmp_path, comps)
    record = meta["sampling"]["fresh_shapes"]
    assert jitter_tokens(10) == 8
    assert record["fresh_samples"] == 16 and record["warm_samples"] == int(prof.columns["n"].sum()) - 16
    lengths = {sum(t) for t in calls.tokens}
    assert lengths == set(range(2, 19))                     # 10 +- 8, no chunk under 2 tokens
