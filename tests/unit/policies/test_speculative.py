"""Speculative decoding in ``paged-kv``: each decoding row verifies its token and k draft
tokens in one step (KV slots for all of them), emits the accepted drafts plus one, and the
draft proposer's time is priced apart. vLLM: vllm/v1/core/sched/scheduler.py (spec_token_ids
scheduled with a request's num_new_tokens; num_lookahead_tokens slots in allocate_slots;
update_from_output rolls num_computed_tokens back by the rejected drafts),
vllm/v1/spec_decode/metrics.py (per-position acceptance rates)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import PagedKV
from schedsim.core.llm_policy import SpeculativeConfig
from schedsim.core.llm_simulate import simulate_llm
from schedsim.core.results import COMPLETED
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import load_step_profile
from schedsim.errors import InputError
from schedsim.run.llm_runner import default_step_profile_path
from llm_helpers import LinearCost, llm_requests, step_log

A, B = 0, 1


def spec(k, rate=None, profile=None, **more):
    cfg = {"method": "eagle", "num_speculative_tokens": k} | more
    cfg |= {"acceptance_rate": rate} if profile is None else {"acceptance_profile": profile}
    return json.dumps(cfg)


def run_steps(policy, requests, n_steps):
    policy.reset(requests)
    policy.on_arrivals(0, 0, len(requests))
    logs = []
    for t in range(n_steps):
        step = policy.schedule(t)
        logs.append((step_log(step), None if step.emit_tokens is None else step.emit_tokens.tolist(),
                     step.verify_only))
        if len(step):
            policy.on_step_done(t, step, 1)
    policy.kv.check()
    return logs


def test_every_draft_accepted_emits_k_plus_one_tokens_a_step():
    policy = PagedKV(block_size=4, num_gpu_blocks=64, speculative_config=spec(2, profile=[1.0, 1.0]))
    req = llm_requests([0], prompt=[8], output=[6])
    assert run_steps(policy, req, 4) == [
        ([(A, 8, 0, True)], [1], False),       # the prompt: one token, no drafts verified yet
        ([(A, 3, 8, True)], [3], True),        # its token and 2 drafts: all accepted, 3 emitted
        ([(A, 3, 11, True)], [2], True),       # 2 left: the third is not emitted
        ([], [], False),
    ]
    stats = policy.stats()
    assert (stats["spec_draft_tokens"], stats["spec_accepted_tokens"]) == (4, 4)
    assert policy.p.computed[A] == 13 and policy.p.generated[A] == 6


def test_no_draft_accepted_emits_one_token_a_step_with_extra_kv_slots():
    policy = PagedKV(block_size=4, num_gpu_blocks=64, speculative_config=spec(3, rate=0.0))
    req = llm_requests([0], prompt=[4], output=[3])
    logs = run_steps(policy, req, 4)
    assert logs[:3] == [([(A, 4, 0, True)], [1], False), ([(A, 4, 4, True)], [1], True),
                        ([(A, 4, 5, True)], [1], True)]
    # Rejected drafts roll back: computed follows the emitted tokens, not the verified ones.
    assert policy.p.computed[A] == 6 and policy.stats()["spec_accepted_tokens"] == 0


def test_drafts_stop_at_the_model_length():
    policy = PagedKV(block_size=4, num_gpu_blocks=64, max_model_len=10, speculative_config=spec(3, rate=1.0))
    req = llm_requests([0], prompt=[7], output=[3])
    logs = run_steps(policy, req, 3)
    assert logs[1] == ([(A, 3, 7, True)], [2], True)   # slots up to 10 tokens: 2 drafts at most
    assert policy.p.generated[A] == 3


def test_acceptance_draws_are_seeded():
    rng = np.random.default_rng(5)
    req = llm_requests(np.cumsum(rng.exponential(0.01, 30)), rng.integers(4, 60, 30), rng.integers(2, 40, 30))

    def run(seed):
        policy = PagedKV(block_size=4, num_gpu_blocks=200, speculative_config=spec(3, rate=0.6, seed=seed))
        return simulate_llm(req, policy, LinearCost()).end_ns.tolist()

    assert run(1) == run(1) and run(1) != run(2)


def test_the_verify_step_is_priced_as_decode_rows_and_drafts_apart():
    model = StepCostModel.from_profile(load_step_profile(default_step_profile_path()))
    req = llm_requests([0], prompt=[32], output=[4])
    policy = PagedKV(num_gpu_blocks=64, async_scheduling=False,
                     speculative_config=spec(2, profile=[1.0, 1.0], draft_cost_fraction=0.25))
    assert model.price_drafts(policy.speculative) is None   # a stated fraction needs no note
    result = simulate_llm(req, policy, model)
    verify = (result.step_end_ns - result.step_start_ns)[1]
    ones = np.ones(3, np.int32)
    gpu = model.step_ns(ones, np.array([32, 33, 34], np.int32))
    draft = round(2 * 0.25 * model.step_ns(np.ones(1, np.int32), np.array([35], np.int32)))
    assert verify == gpu + draft
    assert model.draft_ns(np.array([35]), 2) == draft
    # Without a fraction or profile the method's default is used, and said.
    note = model.price_drafts(SpeculativeConfig.parse(spec(2, rate=0.5)))
    assert "0.1 of a target decode step" in note and model.draft_fraction == 0.1
    assert model.price_drafts(SpeculativeConfig.parse(spec(2, rate=0.5) .replace("eagle", "ngram"))) is not None
    assert model.draft_ns(np.array([35]), 2) == 0   # ngram drafts on the host: free


@pytest.mark.parametrize("text, error", [
    ("{", "not JSON"),
    ('{"method": "magic", "num_speculative_tokens": 2, "acceptance_rate": 0.5}', "method 'magic'"),
    ('{"method": "eagle", "num_speculative_tokens": 0, "acceptance_rate": 0.5}', "num_speculative_tokens 0"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "give one of acceptance_rate"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": 1.5}', "acceptance_rate 1.5"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "acceptance_profile": [0.5, 0.7]}', "increases"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "acceptance_profile": [0.5]}', "expected 2 numbers"),
    ('{"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": 0.5, "k": 1}', "unknown field 'k'"),
])
def test_bad_speculative_configs_are_input_errors(text, error):
    with pytest.raises(InputError, match="--speculative-config: .*" + error.replace("[", r"\[")):
        PagedKV(num_gpu_blocks=64, speculative_config=text)


def test_the_live_driver_needs_a_draft_engine_for_a_model_method():
    # The live engine runs speculative decoding (tests/unit/live/test_llm_speculative.py);
    # a model-drafting method without a draft engine is refused.
    from schedsim.live.llm_driver import _Driver

    policy = PagedKV(num_gpu_blocks=64, speculative_config=spec(2, rate=0.5))
    with pytest.raises(ValueError, match="draft engine"):
        _Driver(llm_requests([0], [4], [2]), policy, None, seed=0, spin_ns=0, clock=None)


class Emitting:
    """Counts each row's emitting steps (for the ITL count: one gap per chunk after the first)."""

    def __init__(self, policy):
        self.inner, self.chunks = policy, {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def schedule(self, now_ns):
        step = self.inner.schedule(now_ns)
        for r, t in zip(step.rows.tolist(), (step.emit_tokens if step.emit_tokens is not None
                                             else step.emits.astype(int)).tolist()):
            self.chunks[r] = self.chunks.get(r, 0) + (t > 0)
        return step


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 20), seed=st.integers(0, 10_000), k=st.integers(1, 4),
       rate=st.floats(0.0, 1.0), blocks=st.integers(8, 60), compat=st.sampled_from(["0.8", "current"]),
       budget=st.integers(4, 64))
def test_speculative_token_accounting_is_exact(n, seed, k, rate, blocks, compat, budget):
    rng = np.random.default_rng(seed)
    req = llm_requests(np.cumsum(rng.exponential(0.01, n)), rng.integers(1, 50, n), rng.integers(1, 30, n))
    policy = PagedKV(block_size=4, num_gpu_blocks=blocks, max_num_batched_tokens=budget, max_model_len=64,
                     vllm_compat=compat, speculative_config=spec(k, rate=rate, seed=seed))
    wrapped = Emitting(policy)
    result = simulate_llm(req, wrapped, LinearCost())
    target = policy.stats()["output_tokens_per_request"]
    done = result.status == COMPLETED
    assert (result.tokens_out[done] == target[done]).all()
    assert (result.tokens_out <= target).all()
    policy.kv.check()
    assert policy.kv.num_used_blocks == 0                       # no leaked blocks, drafts' included
    stats = policy.stats()
    assert 0 <= stats["spec_accepted_tokens"] <= stats["spec_draft_tokens"]
    # Emitted tokens: one per prefill end plus (accepted + 1) per verification, capped.
    assert int(result.tokens_out.sum()) <= int(sum(wrapped.chunks.values())) + stats["spec_accepted_tokens"]
    chunks = np.array([wrapped.chunks.get(r, 0) for r in range(n)])
    assert int(result.itl_count.sum()) == int(np.maximum(chunks - 1, 0).sum())
    again = simulate_llm(req, policy, LinearCost())
    assert again.end_ns.tolist() == result.end_ns.tolist()       # seeded: the same run again


def test_a_band_replication_on_a_slower_host_keeps_the_draft_pricing():
    from schedsim.run.bands import scaled_step_cost

    model = StepCostModel.from_profile(load_step_profile(default_step_profile_path()))
    model.price_drafts(SpeculativeConfig.parse(spec(2, rate=0.5, draft_cost_fraction=0.25)))
    slower = scaled_step_cost(model, 1.5)
    assert slower.draft_fraction == 0.25
    ctx = np.array([35])
    assert slower.draft_ns(ctx, 2) == pytest.approx(1.5 * model.draft_ns(ctx, 2), rel=0.01)
    model.draft = StepCostModel.from_profile(load_step_profile(default_step_profile_path()))
    assert scaled_step_cost(model, 2.0).draft.decode_run_ns(ctx.astype(np.int32), 2).sum() == pytest.approx(
        2.0 * model.draft.decode_run_ns(ctx.astype(np.int32), 2).sum(), rel=0.01)
