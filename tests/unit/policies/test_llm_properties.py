"""Properties of the LLM policies under the simulator, with hypothesis.

Blocks are never over-allocated or leaked, every completed request emits exactly its
output tokens, a preempted request restarts, runs repeat bit for bit, and running
identical decode steps in one event (``Step.repeat``) changes nothing.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import Continuous, PagedKV, StaticLLM
from schedsim.core.llm_simulate import simulate_llm
from schedsim.core.results import COMPLETED, REJECTED_TOO_LONG
from llm_helpers import LinearCost, OneStepAtATime, llm_requests

traces = st.integers(1, 25).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 0.05), min_size=n, max_size=n),
    st.lists(st.integers(1, 60), min_size=n, max_size=n),
    st.lists(st.integers(1, 40), min_size=n, max_size=n),
    st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=4), min_size=n, max_size=n)))


def build(trace, hashes=True):
    gaps, prompt, output, ids = trace
    arrival = np.cumsum(gaps)
    # Prefix ids must be prefix-consistent: make each id encode the path to it.
    hash_ids = [[hash(tuple(h[:i + 1])) % 1000 for i in range(min(len(h), p // 8))]
                for h, p in zip(ids, prompt)] if hashes else None
    # Priorities (for --scheduling-policy priority) drawn from the trace itself: 0, 1 or 2.
    priority = [len(h) % 3 for h in ids]
    return llm_requests(arrival, prompt, output, hash_ids=hash_ids, hash_block_tokens=8, priority=priority)


paged = st.builds(
    PagedKV, block_size=st.sampled_from([2, 4, 8]), num_gpu_blocks=st.integers(4, 60),
    max_num_batched_tokens=st.integers(4, 64), max_num_seqs=st.integers(1, 8),
    enable_prefix_caching=st.booleans(), preemption_mode=st.sampled_from(["recompute", "swap"]),
    swap_space_gb=st.sampled_from([0.0, 0.0001, 0.01]), long_prefill_token_threshold=st.sampled_from([0, 5]),
    max_model_len=st.sampled_from([64, 128]), vllm_compat=st.sampled_from(["0.8", "0.10", "current"]),
    scheduling_policy=st.sampled_from(["fcfs", "priority"]),
    max_num_partial_prefills=st.sampled_from([None, 1, 2]))
# Chunked prefill off: the budget then holds a whole prompt (vLLM's default for it).
unchunked = st.builds(
    PagedKV, block_size=st.sampled_from([2, 4, 8]), num_gpu_blocks=st.integers(4, 60),
    max_num_seqs=st.integers(1, 8), enable_prefix_caching=st.booleans(), enable_chunked_prefill=st.just(False),
    long_prefill_token_threshold=st.sampled_from([0, 5]), max_model_len=st.sampled_from([64, 128]),
    vllm_compat=st.sampled_from(["0.8", "current"]), scheduling_policy=st.sampled_from(["fcfs", "priority"]))
reserving = st.one_of(
    st.builds(Continuous, reservation=st.sampled_from(["max", "pow2", "oracle"]), block_size=st.sampled_from([4, 8]),
              num_gpu_blocks=st.integers(4, 60), max_num_seqs=st.integers(1, 8), max_model_len=st.sampled_from([64, 128])),
    st.builds(StaticLLM, batch_size=st.integers(1, 6), block_size=st.sampled_from([4, 8]),
              num_gpu_blocks=st.integers(4, 60), max_model_len=st.sampled_from([64, 128])))


def fields(result):
    return (result.status.tolist(), result.first_token_ns.tolist(), result.end_ns.tolist(),
            result.tokens_out.tolist(), result.preemptions.tolist(),
            sorted(np.repeat(result.itl_ns, result.itl_count).tolist()))


def check_result(policy, req, result):
    done = result.status == COMPLETED
    # A request longer than the cache or the model allows is stopped at that limit (newer vLLM).
    target = policy.stats().get("output_tokens_per_request", req.output_tokens)
    assert int((target < req.output_tokens).sum()) == policy.stats().get("length_capped", 0)
    assert (result.tokens_out[done] == target[done]).all()
    assert (result.tokens_out <= target).all()
    # Everything that fits eventually finishes: no request is left behind.
    assert ((result.status == COMPLETED) | (result.status == REJECTED_TOO_LONG)).all()
    assert (result.first_token_ns[done] <= result.end_ns[done]).all()
    assert (result.first_token_ns[done] >= req.arrival_ns[done]).all()
    assert (result.step_kv_blocks <= policy.kv_blocks_total).all()
    # ITL gaps: one per output token after the first, for every request that got that far.
    assert int(result.itl_count.sum()) == int(np.maximum(result.tokens_out - 1, 0).sum())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, policy=st.one_of(paged, unchunked))
def test_paged_kv_invariants_and_repeat_equivalence(trace, policy):
    req = build(trace)
    result = simulate_llm(req, policy, LinearCost())
    check_result(policy, req, result)
    kv = policy.kv
    kv.check()
    assert kv.num_used_blocks == 0                     # nothing leaked
    assert kv.num_free_swap_blocks == kv.num_swap_blocks
    again = simulate_llm(req, policy, LinearCost())     # reset() makes the object reusable
    assert fields(again) == fields(result)
    stepwise = simulate_llm(req, OneStepAtATime(policy), LinearCost())
    assert fields(stepwise) == fields(result)
    assert int(stepwise.step_repeats.sum()) == int(result.step_repeats.sum())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, policy=paged, cut=st.floats(0.0, 1.0))
def test_itl_leaves_out_exactly_the_warm_up_requests_gaps(trace, policy, cut):
    """With a warm-up cut, the pooled ITL holds one gap per output token after the first of
    every request arriving at or after the cut, and nothing else changes."""
    req = build(trace)
    full = simulate_llm(req, policy, LinearCost())
    t0 = int(req.arrival_ns.max() * cut) if len(req) else 0
    cut_run = simulate_llm(req, policy, LinearCost(), itl_from_ns=t0)
    measured = req.arrival_ns >= t0
    assert int(cut_run.itl_count.sum()) == int(np.maximum(cut_run.tokens_out[measured] - 1, 0).sum())
    assert fields(cut_run)[:5] == fields(full)[:5]
    # Every gap of the cut run is a gap of the full run (a sub-multiset).
    kept = np.repeat(cut_run.itl_ns, cut_run.itl_count).tolist()
    pool = np.repeat(full.itl_ns, full.itl_count).tolist()
    for g in kept:
        pool.remove(g)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, policy=reserving)
def test_reserving_policies_invariants_and_repeat_equivalence(trace, policy):
    req = build(trace, hashes=False)
    result = simulate_llm(req, policy, LinearCost())
    check_result(policy, req, result)
    assert policy.reserved_blocks == 0
    stepwise = simulate_llm(req, OneStepAtATime(policy), LinearCost())
    assert fields(stepwise) == fields(result)


def test_preempted_request_restarts_its_prefill():
    # Two long decodes in 4 blocks of 4: the second is preempted and recomputes from scratch.
    policy = PagedKV(vllm_compat="0.8", block_size=4, num_gpu_blocks=5, max_num_batched_tokens=100)
    req = llm_requests([0, 0], prompt=[6, 6], output=[8, 8])
    result = simulate_llm(req, policy, LinearCost())
    assert result.preemptions.tolist() == [0, 1]
    assert result.status.tolist() == [COMPLETED, COMPLETED]
    # The recompute step computes B's prompt plus what it had generated.
    assert int(result.step_prefill_tokens.max()) > 6
