"""The GPU-bound eager steps' serial keys (schedsim.cost.step_model.gpu_bound_serial_keys): an eager
step longer than ``decode_attention.gpu_bound_tokens`` whose decode attention leaves
multiprocessors idle pays its serial keys on top of what short, launch-bound steps pay."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from schedsim.errors import InputError
from schedsim.cost.step_fit import (FEATURES, GPU_BOUND_SERIAL_FEATURE, KV_FEATURE, SERIAL_FEATURE, feature_matrix,
                                    features_of, fit_step_profile, gpu_bound_serial_keys, serial_keys, table_digest)
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import ATTENTION_KEY, StepProfile
from step_profile_synthetic import SYNTHETIC_META, TRUE_COEF, compositions, synthetic_columns
from step_profile_synthetic import H200, SIDE, few_decode_rows

BOUND = dataclasses.replace(H200, gpu_bound_tokens=2048)


@pytest.mark.parametrize("tokens, decodes, width, keys", [
    (2048, 4, 32016, 0),            # not over the threshold: launch-bound, nothing added
    (8192, 0, 0, 0),                # no decodes
    (8192, 1, 32016, 32016),        # one block per KV head, 8 of 132 multiprocessors: its serial keys
    (8192, 16, 32016, 32016),       # 128 blocks: still under a wave
    (8192, 17, 32016, 0),           # 136 blocks: a wave or more, throughput-bound
    (8192, 4, 32768, 0),            # 32 pairs split 8 ways: 256 blocks, a wave or more
])
def test_gpu_bound_serial_keys_by_hand(tokens, decodes, width, keys):
    assert gpu_bound_serial_keys(tokens, decodes, width, BOUND, 16) == keys
    if keys:
        assert keys == serial_keys(decodes, width, BOUND, 16)


@given(st.lists(st.tuples(st.integers(0, 9000), st.integers(0, 40), st.integers(1, 2100)), min_size=1, max_size=30))
@settings(max_examples=50, deadline=None)
def test_arrays_give_the_scalar_values(rows):
    tokens, decodes, width = (np.array(c, dtype=np.int64) for c in zip(*rows))
    width = width * 16
    assert gpu_bound_serial_keys(tokens, decodes, width, BOUND, 16).tolist() == [
        gpu_bound_serial_keys(int(t), int(b), int(w), BOUND, 16) for t, b, w in zip(tokens, decodes, width)]


def test_without_gpu_bound_tokens_the_features_and_digest_are_as_before():
    cols = dict(synthetic_columns(), decode_kv_tokens=synthetic_columns()["decode_seqs"])
    assert features_of(cols, H200) == FEATURES + (SERIAL_FEATURE, KV_FEATURE)
    assert features_of(cols, BOUND) == FEATURES + (SERIAL_FEATURE, GPU_BOUND_SERIAL_FEATURE, KV_FEATURE)
    plain = StepProfile.from_columns(cols, dict(SYNTHETIC_META, **{ATTENTION_KEY: SIDE}))
    bound = StepProfile.from_columns(cols, dict(SYNTHETIC_META, **{ATTENTION_KEY: dict(SIDE, gpu_bound_tokens=2048)}))
    assert bound.decode_attention.gpu_bound_tokens == 2048 and plain.decode_attention.gpu_bound_tokens == 0
    digest = [table_digest(p.columns, 16, p.cuda_graph_batch_sizes, p.decode_attention) for p in (plain, bound)]
    assert digest[0] != digest[1]


def columns_with_both(serial: float, bound: float):
    rows = compositions() + few_decode_rows() + [(1, 8192, 0, b, c) for b in (1, 2, 4, 16) for c in (2000, 16000, 32000)]
    cols = synthetic_columns(rows=rows)
    x = feature_matrix(cols, 16, SYNTHETIC_META["cuda_graph_batch_sizes"], BOUND)
    for k in ("latency_ms_mean", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99"):
        cols[k] = cols[k] + serial * x[:, -2] + bound * x[:, -1]
    return cols


def test_the_fit_recovers_both_serial_rates_and_the_model_prices_the_difference():
    meta = dict(SYNTHETIC_META, **{ATTENTION_KEY: dict(SIDE, gpu_bound_tokens=2048)})
    profile = StepProfile.from_columns(columns_with_both(0.0004, 0.0006), meta)
    fit = fit_step_profile(profile)
    assert fit.features == FEATURES + (SERIAL_FEATURE, GPU_BOUND_SERIAL_FEATURE)
    assert fit.coefficients[-2:] == pytest.approx([0.0004, 0.0006], rel=1e-4)
    assert fit.coefficients[:-2] == pytest.approx(TRUE_COEF, rel=1e-3, abs=1e-9)
    model = StepCostModel(profile, fit)

    def price(chunk, ctx):
        return model.step_ns(np.array([chunk, 1]), np.array([0, ctx])) / 1e6
    # One decode at 32,000 (+1: an odd 2,001 blocks, swept whole) against one at 2,000 (126
    # blocks, split in 2): beside 8,192 tokens both rates apply, beside 1,024 only the first.
    keys = serial_keys(1, 32016, BOUND, 16) - serial_keys(1, 2016, BOUND, 16)
    assert keys == 32016 - 1008
    long_chunk = price(8192, 32000) - price(8192, 2000)
    short_chunk = price(1024, 32000) - price(1024, 2000)
    assert long_chunk - short_chunk == pytest.approx(0.0006 * keys, rel=1e-6)


@pytest.mark.parametrize("value", [0, -5, "2048", 1.5])
def test_a_bad_gpu_bound_tokens_names_its_field(value):
    with pytest.raises(InputError, match=r"decode_attention\.gpu_bound_tokens.*integer >= 1") as e:
        StepProfile.from_columns(synthetic_columns(),
                                 dict(SYNTHETIC_META, **{ATTENTION_KEY: dict(SIDE, gpu_bound_tokens=value)}))
    assert "\n" not in str(e.value)
