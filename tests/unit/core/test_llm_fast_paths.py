"""The simulator's fast paths give exactly what the plain ones do.

A batched allocation equals one-block allocations in turn; the free queue's list with
stale entries behaves like the reference whatever its compaction point; step
summaries on Python lists equal those on arrays; paged-kv's busy steps worked out on
arrays decide exactly what row-by-row steps decide, over the same block ids, and match
running every step one at a time.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from policies.kv_cache import KVCacheManager
from policies.paged_kv import PagedKV
from schedsim.core.llm_simulate import simulate_llm
from schedsim.cost.step_model import StepCostModel, _summary_of_arrays, _summary_of_lists
from schedsim.cost.step_profile import StepProfile, load_step_profile
from schedsim.run.llm_runner import default_step_profile_path
from schedsim.core.llm_policy import int_max
from kv_ops import run_ops
from llm_helpers import LinearCost, OneStepAtATime, llm_requests
from step_profile_synthetic import SYNTHETIC_META, synthetic_columns


def busy_manager(seed: int, caching: bool, cls=KVCacheManager, unhashed_first: bool = False):
    """A manager after random traffic: allocations, prefix hits, frees (stale entries)."""
    rng = random.Random(seed)
    kv = cls(64, 4, enable_prefix_caching=caching, free_unhashed_first=unhashed_first)
    held: dict[int, int] = {}
    for step in range(200):
        if rng.random() < 0.6 or not held:
            tokens = rng.randrange(1, 20)
            keys = [(rng.randrange(3) if i < 2 else -step, i) for i in range(tokens // 4 + 1)]
            hit = kv.computed_prefix(step, keys, tokens, count=False)
            if kv.allocate(step, tokens, keys, hit) is not None:
                kv.cache_blocks(step, tokens // 4, keys)
                held[step] = tokens
        else:
            r = rng.choice(sorted(held))
            kv.free(r)
            del held[r]
    return kv, held


@pytest.mark.parametrize("unhashed_first", [False, True])   # freed blocks without a key first (a stack)
@pytest.mark.parametrize("rounds", [False, True])   # fewer blocks than requests (one each), or rounds
@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_round_robin_allocation_equals_one_block_at_a_time(seed, caching, rounds, unhashed_first):
    a, held = busy_manager(seed, caching, unhashed_first=unhashed_first)
    b, _ = busy_manager(seed, caching, unhashed_first=unhashed_first)
    reqs = sorted(held)[:5]
    if not reqs:
        return
    total = min(a.num_free_blocks, 3 * len(reqs) + 2 if rounds else max(1, len(reqs) - 1))
    a.allocate_round_robin(reqs, total)
    for i in range(total):
        r = reqs[i % len(reqs)]
        assert b.allocate(r, (len(b.blocks_of(r)) + 1) * b.block_size) == 1
    a.check()
    assert a.state() == b.state()


def test_round_robin_allocation_without_room_changes_nothing():
    kv, held = busy_manager(1, True)
    before = kv.state()
    with pytest.raises(AssertionError):
        kv.allocate_round_robin(sorted(held)[:1], kv.num_free_blocks + 1)
    assert kv.state() == before


class CompactEarly(KVCacheManager):
    COMPACT_AT = 0


@pytest.mark.parametrize("seed", range(6))
def test_free_queue_compaction_changes_nothing(seed, monkeypatch):
    expected = run_ops(seed)
    monkeypatch.setattr("kv_ops.KVCacheManager", CompactEarly)
    assert run_ops(seed) == expected
    for caching in (False, True):
        a, _ = busy_manager(seed, caching)
        b, _ = busy_manager(seed, caching, CompactEarly)
        b.check()
        assert a.state() == b.state()


def test_step_summaries_on_lists_equal_those_on_arrays():
    rng = np.random.default_rng(0)
    for n in list(range(1, 60)) * 5:
        tokens = np.where(rng.random(n) < 0.7, 1, rng.integers(2, 600, n)).astype(np.int32)
        context = rng.integers(0, 5000, n).astype(np.int32)
        assert _summary_of_lists(tokens.tolist(), context.tolist()) == _summary_of_arrays(tokens, context)
        assert int_max(context) == int(context.max())


@pytest.fixture(scope="module")
def step_models() -> list[StepCostModel]:
    """The bundled profile's model (serial keys, real KV) and a synthetic one (neither)."""
    return [StepCostModel.from_profile(load_step_profile(default_step_profile_path())),
            StepCostModel.from_profile(StepProfile.from_columns(synthetic_columns(), SYNTHETIC_META))]


@hyp_settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from([1, 1, 1, 2, 17, 512, 1500, 4096]), st.integers(0, 6000)),
                     min_size=1, max_size=40).filter(lambda rows: any(q > 1 for q, _ in rows)))
def test_eager_step_prices_equal_the_full_feature_sum(step_models, rows):
    """A step with a prefill is priced from the eager features alone: the same int as the sum
    over every feature, graph ones (zero for it) included."""
    tokens = np.array([q for q, _ in rows], np.int32)
    context = np.array([c for _, c in rows], np.int32)
    for model in step_models:
        assert model._eager_coef is not None
        seen = set(model.seen_tokens)   # (a token count's first step costs more: the same for both)
        fast = model.step_ns(tokens, context)
        full = copy.copy(model)
        full._eager_coef, full.seen_tokens = None, seen
        assert fast == full.step_ns(tokens, context)


# --- paged-kv: busy steps worked out on arrays equal steps worked out row by row ----------

class ArrayPagedKV(PagedKV):
    VECTOR_ROWS = 1   # every step with a running row goes through _running_columns


class RowPagedKV(PagedKV):
    VECTOR_ROWS = 1 << 30   # never
    DECODE_AFTER = False   # every step decided when the one before it ends


class RowMergedPagedKV(PagedKV):
    VECTOR_ROWS = 1 << 30   # never; steps carry the decode run after them (Step.then)


def subsequence(part: list, whole: list) -> bool:
    rest = iter(whole)
    return all(any(x == y for y in rest) for x in part)


class Logged:
    """Wraps a policy: logs each step with every row's block table and the free blocks."""

    def __init__(self, policy):
        self.policy, self.log = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def on_arrivals(self, now_ns, first, stop):
        self.policy.on_arrivals(now_ns, first, stop)

    def schedule(self, now_ns):
        step = self.policy.schedule(now_ns)
        kv = self.policy.kv
        self.log.append((now_ns, step.rows.tolist(), step.num_tokens.tolist(), step.context.tolist(),
                         step.emits.tolist(), step.repeat, step.preempted.tolist(),
                         [tuple(kv.blocks_of(r)) for r in step.rows.tolist()], tuple(kv.free_block_ids())))
        return step

    def on_step_done(self, now_ns, step, repeats):
        self.policy.on_step_done(now_ns, step, repeats)


busy_traces = st.integers(1, 70).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 0.02), min_size=n, max_size=n),
    st.lists(st.integers(1, 90), min_size=n, max_size=n),
    st.lists(st.integers(1, 60), min_size=n, max_size=n),
    st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=6), min_size=n, max_size=n),
    st.booleans()))

settings_ = st.fixed_dictionaries({
    "block_size": st.sampled_from([2, 4, 16]), "num_gpu_blocks": st.integers(8, 400),
    "max_num_batched_tokens": st.integers(8, 512), "max_num_seqs": st.integers(1, 64),
    "enable_prefix_caching": st.booleans(), "preemption_mode": st.sampled_from(["recompute", "swap"]),
    "swap_space_gb": st.sampled_from([0.0, 0.001, 0.01]), "long_prefill_token_threshold": st.sampled_from([0, 7, 64]),
    "max_model_len": st.sampled_from([64, 160]), "vllm_compat": st.sampled_from(["0.8", "0.10", "current"]),
    "scheduling_policy": st.sampled_from(["fcfs", "priority"]),
    "max_num_partial_prefills": st.sampled_from([None, None, None, 2]),
    "enable_chunked_prefill": st.sampled_from([True, True, True, False])})


def busy_requests(trace):
    gaps, prompt, output, ids, hashed = trace
    # Prefix-consistent ids (each encodes the path to it), some shared, some a request's own.
    hash_ids = [[hash(tuple(h[:i + 1])) % 1000 for i in range(min(len(h), p // 8))]
                for h, p in zip(ids, prompt)] if hashed else None
    return llm_requests(np.cumsum(gaps), prompt, output, hash_ids=hash_ids, hash_block_tokens=8,
                        priority=[len(h) % 3 for h in ids])


def result_arrays(result):
    return {name: value.tolist() for name, value in vars(result).items() if isinstance(value, np.ndarray)}


@hyp_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=busy_traces, params=settings_)
def test_paged_kv_array_steps_equal_row_by_row_steps(trace, params):
    """The same decisions over the same block ids, and the same result bit for bit, whether
    the running rows' part of a step is worked out on arrays or row by row; and the same
    per-request times and gaps as running every step one at a time."""
    if not params["enable_chunked_prefill"]:
        params = {**params, "max_num_batched_tokens": None}
    req = busy_requests(trace)
    runs = []
    for cls in (ArrayPagedKV, RowPagedKV, PagedKV, RowMergedPagedKV):
        policy = Logged(cls(**params))
        result = simulate_llm(req, policy, LinearCost())
        policy.kv.check()
        runs.append((policy.log, result_arrays(result), result.stats))
    (log_a, arrays_a, stats_a), (log_r, arrays_r, stats_r), (log_d, arrays_d, _), (log_m, arrays_m, _) = runs
    assert log_a == log_r
    # A step that carries the decode run after it leaves that run's decision out of the
    # log (decided ahead): the others are the same, over the same blocks, in order.
    assert subsequence(log_d, log_r) and subsequence(log_m, log_r)
    assert arrays_a == arrays_r == arrays_d == arrays_m
    assert {k: v for k, v in stats_a.items() if not isinstance(v, np.ndarray)} == \
        {k: v for k, v in stats_r.items() if not isinstance(v, np.ndarray)}
    stepwise = simulate_llm(req, OneStepAtATime(RowPagedKV(**params)), LinearCost())
    folded = simulate_llm(req, ArrayPagedKV(**params), LinearCost())
    for name in ("status", "scheduled_ns", "first_token_ns", "end_ns", "tokens_out", "preemptions",
                 "prefix_hit_tokens"):
        assert np.array_equal(getattr(stepwise, name), getattr(folded, name)), name
    assert (sorted(np.repeat(stepwise.itl_ns, stepwise.itl_count).tolist())
            == sorted(np.repeat(folded.itl_ns, folded.itl_count).tolist()))
