"""The eager decode attention's serial keys (schedsim.cost.step_model.serial_keys, DecodeAttention).

On the H200 an eager step's decode attention runs one kernel block per (decode row, KV
head) over the row's whole padded width unless the width splits, so a few decodes over a
long context cost what one block's sweep costs (experiments/llm_profile/few-decodes/).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from schedsim.errors import InputError
from schedsim.cost.step_fit import (FEATURES, KV_FEATURE, SERIAL_FEATURE, feature_matrix, features_of,
                                    fit_step_profile, serial_keys, table_digest)
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import ATTENTION_KEY, DecodeAttention, StepProfile
from step_profile_synthetic import H200, SIDE, SYNTHETIC_META, TRUE_COEF, few_decode_rows, synthetic_columns



@pytest.mark.parametrize("decodes, width, keys", [
    (0, 32016, 0),
    (1, 32016, 32016),        # 2,001 blocks: odd, no split, one block sweeps it all
    (1, 32768, 2 * 1024),     # 2,048 blocks: 32 segments of 64; 256 blocks run in two waves
    (4, 32768, 2 * 4096),     # 32 pairs: 8 segments
    (5, 32768, 32768),        # 40 pairs: more than 256 // 8, no split
    (16, 32016, 32016),       # 128 blocks: one wave over 132 multiprocessors
    (32, 32016, 2 * 32016),   # 256 blocks: two waves
])
def test_serial_keys_by_hand(decodes, width, keys):
    assert serial_keys(decodes, width, H200, 16) == keys


@pytest.mark.parametrize("decodes, keys", [
    (16, 32016),              # 128 blocks: one wave either way
    (32, 32016),              # 256 blocks: two waves of 132, one of 4 x 132
    (66, 32016),              # 528 blocks: exactly one wave of 528
    (67, 2 * 32016),          # 536 blocks: two
])
def test_resident_blocks_widen_a_wave(decodes, keys):
    four = dataclasses.replace(H200, blocks_per_multiprocessor=4)
    assert serial_keys(decodes, 32016, four, 16) == keys


def test_the_optional_field_keeps_old_digests_and_is_read_from_the_sidecar():
    cols = dict(synthetic_columns(), decode_kv_tokens=synthetic_columns()["decode_seqs"])
    plain = StepProfile.from_columns(cols, dict(SYNTHETIC_META, **{ATTENTION_KEY: SIDE}))
    one = StepProfile.from_columns(cols, dict(SYNTHETIC_META, **{ATTENTION_KEY: dict(SIDE, blocks_per_multiprocessor=1)}))
    four = StepProfile.from_columns(cols, dict(SYNTHETIC_META, **{ATTENTION_KEY: dict(SIDE, blocks_per_multiprocessor=4)}))
    assert four.decode_attention.blocks_per_multiprocessor == 4 and plain.decode_attention == one.decode_attention
    digest = [table_digest(p.columns, 16, p.cuda_graph_batch_sizes, p.decode_attention) for p in (plain, one, four)]
    assert digest[0] == digest[1] != digest[2]


def test_splits_restate_the_engines_rule():
    pytest.importorskip("torch")   # the engine module needs it
    from types import SimpleNamespace

    from schedsim.live.engines.llm_engine import PagedLLMEngine

    engine = SimpleNamespace(cfg=SimpleNamespace(kv_heads=8), decode_split_ctas=256, min_split_blocks=16)
    for b, blocks in itertools.product(range(1, 20), (1, 15, 16, 32, 63, 64, 126, 256, 1001, 2001, 2048, 4096)):
        assert H200.splits(b, blocks) == PagedLLMEngine.decode_splits(engine, b, blocks), (b, blocks)


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 12000)), min_size=1, max_size=30))
@settings(max_examples=50, deadline=None)
def test_arrays_give_the_scalar_values(rows):
    decodes = np.array([b for b, _ in rows], dtype=np.int64)
    width = np.array([w * 16 for _, w in rows], dtype=np.int64)
    assert serial_keys(decodes, width, H200, 16).tolist() == [serial_keys(int(b), int(w), H200, 16)
                                                              for b, w in zip(decodes, width)]




def columns_with_serial(coef_serial: float):
    from step_profile_synthetic import compositions

    rows = compositions() + few_decode_rows()
    cols = synthetic_columns(rows=rows)   # the synthetic truth without the serial term ...
    extra = feature_matrix(cols, 16, SYNTHETIC_META["cuda_graph_batch_sizes"], H200)[:, -1]
    for k in ("latency_ms_mean", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99"):
        cols[k] = cols[k] + coef_serial * extra   # ... plus it
    return cols


def test_a_sidecar_with_decode_attention_adds_the_feature_and_the_fit_recovers_it():
    meta = dict(SYNTHETIC_META, **{ATTENTION_KEY: SIDE})
    profile = StepProfile.from_columns(columns_with_serial(0.001), meta)
    fit = fit_step_profile(profile)
    assert fit.features == FEATURES + (SERIAL_FEATURE,)
    assert fit.coefficients[-1] == pytest.approx(0.001, rel=1e-4)
    assert fit.coefficients[:-1] == pytest.approx(TRUE_COEF, rel=1e-3, abs=1e-9)
    assert fit.mape_pct < 1e-3


def test_without_the_sidecar_key_the_features_are_as_before():
    cols = synthetic_columns()
    assert features_of(cols) == FEATURES
    assert features_of(dict(cols, decode_kv_tokens=cols["decode_seqs"])) == FEATURES + (KV_FEATURE,)
    assert features_of(dict(cols, decode_kv_tokens=cols["decode_seqs"]), H200) == \
        FEATURES + (SERIAL_FEATURE, KV_FEATURE)


@pytest.fixture(scope="module")
def model():
    meta = dict(SYNTHETIC_META, **{ATTENTION_KEY: SIDE})
    return StepCostModel.from_profile(StepProfile.from_columns(columns_with_serial(0.001), meta))


def test_a_long_decode_beside_a_chunk_costs_its_serial_keys(model):
    def price(ctx):
        return model.step_ns(np.array([512, 1]), np.array([0, ctx]))
    # Context 32,000 (+1): an odd 2,001 blocks, swept whole; 32,767: 2,048 blocks, 32 segments.
    serial_ms = model.fit.coefficients[-1] * (32016 - 2048)
    width_ms = model.fit.coefficients[FEATURES.index("eager_decode_kv_tokens")] * (32016 - 32768)
    assert (price(32000) - price(32767)) / 1e6 == pytest.approx(serial_ms + width_ms, rel=1e-6)


@given(st.integers(257, 400), st.integers(0, 20000), st.integers(1, 300))
@settings(max_examples=25, deadline=None)
def test_eager_decode_runs_equal_looped_steps_bit_for_bit(model, n, ctx, k):
    context = np.full(n, ctx, dtype=np.int64)
    looped = [model.step_ns(np.ones(n, dtype=np.int64), context + j) for j in range(k)]
    assert model.decode_run_ns(context, k).tolist() == looped


@pytest.mark.parametrize("value, field", [
    (dict(SIDE, kv_heads=0), "kv_heads"),
    ({k: v for k, v in SIDE.items() if k != "multiprocessors"}, "multiprocessors"),
    ("fast", "kv_heads"),
    (dict(SIDE, blocks_per_multiprocessor=0), "blocks_per_multiprocessor"),
    (dict(SIDE, blocks_per_multiprocessor="4"), "blocks_per_multiprocessor"),
])
def test_a_bad_decode_attention_names_its_field(value, field):
    with pytest.raises(InputError, match=rf"decode_attention\.{field}.*integer >= 1") as e:
        StepProfile.from_columns(synthetic_columns(), dict(SYNTHETIC_META, **{ATTENTION_KEY: value}))
    assert "\n" not in str(e.value)
