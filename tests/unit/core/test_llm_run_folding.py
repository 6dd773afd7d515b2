"""Runs of identical decode steps folded into one event give what running every step one
at a time gives, also where the run goes on past arrivals that only join a waiting queue
(:attr:`Step.arrivals_wait`): the same per-request times, inter-token gaps, rejections and
steps (each folded event is the stepwise steps it stands for: same rows, contexts one
token further each step, same start and end)."""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from policies import PagedKV
from schedsim.core.llm_simulate import simulate_llm
from schedsim.core.results import REJECTED_TOO_LONG
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import load_step_profile
from schedsim.run.llm_runner import default_step_profile_path
from llm_helpers import LinearCost, OneStepAtATime, llm_requests

PER_REQUEST = ("status", "scheduled_ns", "first_token_ns", "end_ns", "tokens_out", "preemptions",
               "prefix_hit_tokens")


@lru_cache(maxsize=1)
def bundled_cost() -> StepCostModel:
    """The bundled H200 step model: one price over most runs (the driver's division path)."""
    return StepCostModel.from_profile(load_step_profile(default_step_profile_path()), bytes_per_block=1 << 15)


class Recorder:
    """Wraps a policy: each non-empty step as (rows, tokens, contexts, emits, preempted) and
    how many times it ran, and how often arrivals came in during a run (and stopped it)."""

    def __init__(self, policy):
        self.policy, self.steps, self.in_run = policy, [], [0, 0]

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def on_arrivals(self, now_ns, first, stop):
        self.policy.on_arrivals(now_ns, first, stop)

    def on_arrivals_in_run(self, now_ns, first, stop):
        goes_on = self.policy.on_arrivals_in_run(now_ns, first, stop)
        self.in_run[goes_on] += 1
        return goes_on

    def schedule(self, now_ns):
        step = self.policy.schedule(now_ns)
        if len(step):
            self.steps.append([step.rows.tolist(), step.num_tokens.tolist(), step.context.tolist(),
                               step.emits.tolist(), step.preempted.tolist(), None])
        return step

    def on_step_done(self, now_ns, step, repeats):
        then = step.then
        if then is not None and repeats > 1:   # the step, then its decode run (Step.then)
            self.steps[-1][-1] = 1
            self.steps.append([then.rows.tolist(), then.num_tokens.tolist(), then.context.tolist(),
                               then.emits.tolist(), then.preempted.tolist(), repeats - 1])
        else:
            self.steps[-1][-1] = repeats
        self.policy.on_step_done(now_ns, step, repeats)


def run_both(req, params, cost):
    """(folded result, its recorder, stepwise result, its recorder)."""
    folded = Recorder(PagedKV(**params))
    a = simulate_llm(req, folded, cost)
    folded.policy.kv.check()
    stepwise = Recorder(PagedKV(**params))
    b = simulate_llm(req, OneStepAtATime(stepwise), cost)
    return a, folded, b, stepwise


def assert_same_run(a, folded, b, stepwise):
    for name in PER_REQUEST:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert (sorted(np.repeat(a.itl_ns, a.itl_count).tolist())
            == sorted(np.repeat(b.itl_ns, b.itl_count).tolist()))
    assert np.array_equal(a.step_repeats, [s[-1] for s in folded.steps])
    i = 0
    for e, (rows, tokens, context, emits, preempted, repeats) in enumerate(folded.steps):
        assert b.step_start_ns[i] == a.step_start_ns[e]
        for j in range(repeats):
            s_rows, s_tokens, s_context, s_emits, s_preempted, _ = stepwise.steps[i + j]
            assert (s_rows, s_tokens, s_emits) == (rows, tokens, emits)
            assert s_context == [c + j for c in context]
            assert s_preempted == (preempted if j == 0 else [])
        i += repeats
        assert b.step_end_ns[i - 1] == a.step_end_ns[e]
    assert i == len(stepwise.steps) == b.step_start_ns.size


def test_a_run_goes_on_past_arrivals_that_wait():
    # One sequence at a time: A decodes 40 tokens while B waits; C and D arrive during
    # A's run and queue behind B, so A's run is one event (it is cut only where A ends).
    req = llm_requests([0.0, 0.001, 0.005, 0.02], prompt=[8, 8, 8, 8], output=[40, 5, 5, 5])
    params = dict(block_size=4, num_gpu_blocks=200, max_num_seqs=1, enable_prefix_caching=False)
    a, folded, b, stepwise = run_both(req, params, LinearCost())
    assert_same_run(a, folded, b, stepwise)
    assert folded.in_run == [0, 2]
    assert folded.steps[1][0] == [0] and folded.steps[1][-1] == 39   # A's whole decode
    assert a.step_start_ns.size < b.step_start_ns.size


def test_an_arrival_rejected_during_a_run_stops_it_where_it_arrived():
    # C is longer than the model allows: rejected at the end of the step it arrived in, as
    # step by step; A's run stops there and goes on in a new event.
    req = llm_requests([0.0, 0.001, 0.02], prompt=[8, 8, 100], output=[40, 5, 5])
    params = dict(block_size=4, num_gpu_blocks=200, max_num_seqs=1, max_model_len=64,
                  enable_prefix_caching=False, vllm_compat="0.8")
    a, folded, b, stepwise = run_both(req, params, LinearCost())
    assert_same_run(a, folded, b, stepwise)
    assert folded.in_run == [1, 0]
    assert a.status[2] == REJECTED_TOO_LONG and a.end_ns[2] == b.end_ns[2]
    assert a.end_ns[2] in a.step_end_ns.tolist()


def test_priority_scheduling_never_runs_past_an_arrival():
    # A later arrival may come first by priority: every run stops where one arrives.
    req = llm_requests([0.0, 0.001, 0.005], prompt=[8, 8, 8], output=[40, 5, 5], priority=[0, 1, 0])
    params = dict(block_size=4, num_gpu_blocks=200, max_num_seqs=1, enable_prefix_caching=False,
                  scheduling_policy="priority")
    a, folded, b, stepwise = run_both(req, params, LinearCost())
    assert_same_run(a, folded, b, stepwise)
    assert folded.in_run == [0, 0]


SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.6, "seed": 1})

traces = st.integers(1, 60).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from([0.0, 0.0005, 0.002, 0.01, 0.05]), min_size=n, max_size=n),
    st.lists(st.integers(1, 120), min_size=n, max_size=n),
    st.lists(st.integers(1, 80), min_size=n, max_size=n),
    st.lists(st.lists(st.integers(0, 2), max_size=5), min_size=n, max_size=n),
    st.lists(st.integers(0, 2), min_size=n, max_size=n),
    st.booleans()))

engines = st.fixed_dictionaries({
    "block_size": st.sampled_from([2, 4, 16]), "num_gpu_blocks": st.sampled_from([12, 40, 150, 2000]),
    "max_num_batched_tokens": st.sampled_from([16, 64, 512]), "max_num_seqs": st.sampled_from([1, 2, 5, 32]),
    "enable_prefix_caching": st.booleans(), "preemption_mode": st.sampled_from(["recompute", "swap"]),
    "swap_space_gb": st.sampled_from([0.0, 0.01]), "max_model_len": st.sampled_from([96, 256]),
    "vllm_compat": st.sampled_from(["0.8", "0.10", "current"]),
    "scheduling_policy": st.sampled_from(["fcfs", "fcfs", "priority"]),
    "enable_chunked_prefill": st.sampled_from([True, True, False]),
    "long_prefill_token_threshold": st.sampled_from([0, 0, 24]),
    "speculative_config": st.sampled_from([None, None, None, SPEC])})


@hyp_settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, params=engines, bundled=st.booleans())
def test_folded_runs_equal_steps_one_at_a_time(trace, params, bundled):
    gaps, prompt, output, ids, priority, hashed = trace
    if not params["enable_chunked_prefill"]:
        params = {**params, "max_num_batched_tokens": None}
    hash_ids = [[hash(tuple(h[:i + 1])) % 1000 for i in range(min(len(h), p // 8))]
                for h, p in zip(ids, prompt)] if hashed else None
    req = llm_requests(np.cumsum(gaps), prompt, output, hash_ids=hash_ids, hash_block_tokens=8,
                       priority=priority)
    cost = bundled_cost() if bundled else LinearCost()
    assert_same_run(*run_both(req, params, cost))
