"""The cost models declare the seams the drivers read (schedsim/cost/protocols.py)."""

from __future__ import annotations

import numpy as np

from llm_helpers import LinearCost, llm_requests
from policies import NoBatching
from policies.paged_kv import PagedKV
from schedsim.core.llm_simulate import simulate_llm
from schedsim.core.policy import Requests
from schedsim.core.simulate import simulate
from schedsim.cost.model import CostModel
from schedsim.cost.profile import default_profile_path, load_profile
from schedsim.cost.protocols import BatchCost, StepCost, batch_cost, step_cost
from schedsim.cost.step_model import StepCostModel
from step_profile_synthetic import synthetic_profile
from schedsim.traces.table import Trace


def test_the_cost_model_declares_every_capability():
    cost = CostModel.from_profile(load_profile(default_profile_path()))
    assert isinstance(cost, BatchCost) and batch_cost(cost) is cost
    assert cost.one_draw_per_sample and cost.power_cap is not None
    assert cost.at_concurrency(2) is cost and cost.pair_slowdown is None
    off = CostModel.from_profile(load_profile(default_profile_path()), power_cap=False, wake_overhead_s=0.0)
    assert off.power_cap is None and off.wake_ns(10**9) == 0 and not off.wake_is_random


def test_the_step_cost_model_declares_run_segments():
    model = StepCostModel.from_profile(synthetic_profile())
    assert isinstance(model, StepCost) and step_cost(model) is model
    assert model.decode_run_segments is not None


class _OnlySampleS:
    def sample_s(self, samples, seq_len, rng):
        return 0.001


class _OnlyStepNs:
    def step_ns(self, num_tokens, context, swap_blocks=0):
        return LinearCost().step_ns(num_tokens, context, swap_blocks)


def test_a_cost_model_with_only_the_required_method_runs_with_no_capability():
    plain = batch_cost(_OnlySampleS())
    assert (plain.power_cap, plain.pair_slowdown, plain.wake_is_random, plain.one_draw_per_sample) == \
        (None, None, False, False)
    assert plain.wake_ns(10**9) == 0 and plain.at_concurrency(3) is plain
    req = Requests.from_trace(Trace.from_arrivals([0.0, 0.0005, 0.01]))
    result = simulate(req, NoBatching(), _OnlySampleS(), instances=2)
    assert (result.batch_end_ns - result.batch_start_ns).tolist() == [1_000_000] * 3


def test_a_step_cost_without_decode_runs_prices_them_step_by_step():
    plain = step_cost(_OnlyStepNs())
    assert plain.decode_run_segments is None
    context = np.array([3, 40, 7], np.int32)
    assert plain.decode_run_ns(context, 5).tolist() == LinearCost().decode_run_ns(context, 5).tolist()
    req = llm_requests(np.array([0.0, 0.001, 0.002]), [20, 30, 10], [8, 5, 12])
    runs = [simulate_llm(req, PagedKV(block_size=4, num_gpu_blocks=64), cost)
            for cost in (_OnlyStepNs(), LinearCost())]
    assert runs[0].end_ns.tolist() == runs[1].end_ns.tolist()
    assert runs[0].first_token_ns.tolist() == runs[1].first_token_ns.tolist()
