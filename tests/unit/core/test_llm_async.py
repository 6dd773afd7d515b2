"""Async scheduling: a step's host time overlaps the GPU time of the step (vLLM prepares
step n+1 while step n runs), so a step takes max(gpu, host) instead of gpu + host."""

from __future__ import annotations

import numpy as np

from policies import PagedKV
from schedsim.core.llm_simulate import simulate_llm
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import load_step_profile
from schedsim.run.llm_runner import default_step_profile_path
from llm_helpers import LinearCost, llm_requests


class HostCost(LinearCost):
    """LinearCost whose steps hold ``host`` ns of host time (plus 1 us per row)."""

    def __init__(self, host):
        super().__init__()
        self.host = host

    def host_ns(self, rows):
        return self.host + 1000 * rows

    def step_ns(self, num_tokens, context, swap_blocks=0):   # host time is part of a step's price
        return super().step_ns(num_tokens, context, swap_blocks) + self.host_ns(num_tokens.shape[0])

    def decode_run_ns(self, context, k):
        return super().decode_run_ns(context, k) + self.host_ns(context.shape[0])


def workload():
    rng = np.random.default_rng(3)
    n = 40
    return llm_requests(np.cumsum(rng.exponential(0.01, n)), rng.integers(4, 200, n), rng.integers(1, 60, n))


def durations(result):
    return (result.step_end_ns - result.step_start_ns) // result.step_repeats


def test_async_scheduling_hides_host_time_up_to_the_gpu_time():
    req = workload()
    for host in (300_000, 5_000_000):   # less than, then more than, most steps' GPU time
        sync = simulate_llm(req, PagedKV(num_gpu_blocks=400, async_scheduling=False), HostCost(host))
        over = simulate_llm(req, PagedKV(num_gpu_blocks=400, async_scheduling=True), HostCost(host))
        assert (over.status == sync.status).all()
        assert over.end_ns.max() < sync.end_ns.max()
        # No step is shorter than its host time, nor than its GPU time under LinearCost.
        h = host + 1000 * over.step_seqs.astype(np.int64)
        assert (durations(over) >= h).all()


def test_async_step_price_is_max_of_gpu_and_host_exactly():
    # One request alone: prompt step then decodes; each step's sync price p becomes max(p - h, h).
    req = llm_requests([0], [32], [5])
    cost = HostCost(200_000)
    sync = simulate_llm(req, PagedKV(num_gpu_blocks=64, async_scheduling=False), cost)
    over = simulate_llm(req, PagedKV(num_gpu_blocks=64, async_scheduling=True), cost)
    h = 200_000 + 1000
    p = np.repeat(durations(sync), sync.step_repeats)
    q = np.repeat(durations(over), over.step_repeats)
    assert q.tolist() == np.maximum(p - h, h).tolist()
    slow = HostCost(50_000_000)   # host time longer than the GPU's: the host sets the pace
    over = simulate_llm(req, PagedKV(num_gpu_blocks=64, async_scheduling=True), slow)
    assert set(np.repeat(durations(over), over.step_repeats).tolist()) == {50_001_000}


def test_a_cost_model_without_host_time_is_priced_as_before():
    req = workload()
    plain = simulate_llm(req, PagedKV(num_gpu_blocks=400, async_scheduling=True), LinearCost())
    sync = simulate_llm(req, PagedKV(num_gpu_blocks=400, async_scheduling=False), LinearCost())
    assert plain.step_end_ns.tolist() == sync.step_end_ns.tolist()


def test_the_step_model_declares_its_host_time():
    model = StepCostModel.from_profile(load_step_profile(default_step_profile_path()))
    assert model.host_ns(8) == round(model.overhead_ns + model.loop_ns[0] + 8 * model.loop_ns[1])
    req = workload()
    sync = simulate_llm(req, PagedKV(num_gpu_blocks=400, async_scheduling=False), model)
    over = simulate_llm(req, PagedKV(num_gpu_blocks=400, async_scheduling=True), model)
    assert over.end_ns.max() <= sync.end_ns.max()
