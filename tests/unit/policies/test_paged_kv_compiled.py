"""paged-kv replayed compiled gives what the Python path gives, bit for bit.

``policies/paged_kv_compiled.py`` restates PagedKV's scheduling, its block manager,
simulate_llm's driver and StepCostModel's prices in numba. Here random traces and settings
(shared prefixes, preemption, chunked and whole-prompt admission, thresholds, watermarks,
async scheduling, length limits, first-call costs, context extrapolation) run both ways, and every array of the result, the policy's
counters and the warnings must agree; and the replay must actually run where it claims to.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from policies import paged_kv_compiled
from policies.paged_kv import PagedKV
from schedsim.core.llm_simulate import simulate_llm
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import load_step_profile
from schedsim.run.llm_runner import default_step_profile_path
from llm_helpers import LinearCost, llm_requests

pytestmark = pytest.mark.skipif(paged_kv_compiled.numba is None, reason="numba is not installed")


def _cost(first_call_ms: float = 0.0, max_context: int | None = None, loop_us=None) -> StepCostModel:
    cost = StepCostModel.from_profile(load_step_profile(default_step_profile_path()), loop_overhead_us=loop_us)
    cost.first_call_ns = first_call_ms * 1e6
    if max_context is not None:
        cost.max_context_measured = max_context
    return cost


def _run(req, params: dict, cost_args: dict, compiled: bool):
    policy = PagedKV(**params)
    policy.COMPILED = compiled
    policy.COMPILED_FROM = 0   # (however small the trace)
    cost = _cost(**cost_args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = simulate_llm(req, policy, cost, seed=3)
    return result, policy, cost, [str(w.message) for w in caught]


def _assert_same(a, b) -> None:
    for name, x in vars(a).items():
        y = getattr(b, name)
        if name == "requests":
            continue
        if name == "stats":
            assert x.keys() == y.keys()
            for key in x:
                if isinstance(x[key], np.ndarray):
                    np.testing.assert_array_equal(x[key], y[key], err_msg=f"stats[{key}]")
                else:
                    assert x[key] == y[key], key
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            assert x == y, name


SETTINGS = st.fixed_dictionaries({
    "block_size": st.sampled_from([16]),   # the profile's block size (another is not covered)
    "num_gpu_blocks": st.one_of(st.integers(6, 60), st.integers(6, 400)),
    "max_num_seqs": st.integers(1, 40),
    "max_num_batched_tokens": st.sampled_from([None, 48, 200, 1024, 4096]),
    "enable_chunked_prefill": st.booleans(),
    "enable_prefix_caching": st.booleans(),
    "async_scheduling": st.booleans(),
    "scheduler_reserve_full_isl": st.booleans(),
    "long_prefill_token_threshold": st.sampled_from([0, 0, 24, 100]),
    "watermark": st.sampled_from([None, 0.0, 0.05, 0.3]),
    "vllm_compat": st.sampled_from(["current", "current", "0.10", "0.8"]),
    "max_model_len": st.sampled_from([None, 256, 2048]),
})
COSTS = st.fixed_dictionaries({
    "first_call_ms": st.sampled_from([0.0, 0.0, 3.5]),
    "max_context": st.sampled_from([None, None, 300]),
    "loop_us": st.sampled_from([None, (0.0, 0.0), (120.0, 7.5)]),
})


@st.composite
def traces(draw):
    n = draw(st.integers(1, 80))
    gaps = draw(st.lists(st.floats(0.0, 0.2), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 700), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 200), min_size=n, max_size=n))
    if not draw(st.booleans()):
        return llm_requests(np.cumsum(gaps), prompt, output)
    # Prefix hash ids, as Mooncake's: requests of one family share their first ids (a common
    # prefix), then have their own; 48 tokens an id is not a whole number of blocks.
    per_id = draw(st.sampled_from([16, 32, 48]))
    hash_ids = []
    for i in range(n):
        ids = -(-prompt[i] // per_id)
        family, common = draw(st.integers(0, 3)), draw(st.integers(0, ids))
        own = [10_000 * (i + 1) + j for j in range(ids - common)]
        hash_ids.append([family * 1000 + j for j in range(common)] + own)
    return llm_requests(np.cumsum(gaps), prompt, output, hash_ids=hash_ids, hash_block_tokens=per_id)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(req=traces(), params=SETTINGS, cost_args=COSTS)
def test_compiled_replay_matches_python(req, params, cost_args):
    if params["max_num_batched_tokens"] is not None and not params["enable_chunked_prefill"]:
        params["max_num_batched_tokens"] = max(params["max_num_batched_tokens"], params["max_model_len"] or 1 << 20)
    try:
        PagedKV(**params)
    except Exception:   # settings the policy refuses (e.g. a budget below the model length)
        return
    fast, fast_policy, fast_cost, fast_warnings = _run(req, params, cost_args, True)
    slow, slow_policy, slow_cost, slow_warnings = _run(req, params, cost_args, False)
    _assert_same(fast, slow)
    assert fast_warnings == slow_warnings
    assert fast_policy.stats().keys() == slow_policy.stats().keys()
    assert fast_cost.seen_tokens == slow_cost.seen_tokens
    assert fast_cost.extrapolated == slow_cost.extrapolated


CASES = {
    # (arrival s, prompt, output), settings
    "watermark with nothing running": (([0.0], [250], [5]), dict(num_gpu_blocks=20, watermark=0.3)),
    "watermark before every admission": (([0.0, 0.0], [250, 40], [5, 5]),
                                         dict(num_gpu_blocks=20, watermark=0.3, vllm_compat="0.8")),
    "whole prompts only": (([0.0, 0.001, 0.002], [900, 3000, 20], [30, 3, 40]),
                           dict(enable_chunked_prefill=False, max_num_batched_tokens=4096, max_model_len=4096)),
    "capped at the model length": (([0.0, 0.01], [200, 250], [100, 3]), dict(max_model_len=256)),
    "rejected at the model length": (([0.0, 0.01], [200, 250], [100, 3]), dict(max_model_len=256, vllm_compat="0.8")),
    "threshold": (([0.0, 0.0, 0.3], [700, 500, 90], [20, 20, 20]), dict(long_prefill_token_threshold=64)),
    "decode run cut by an arrival": (([0.0, 0.0205, 0.5], [30, 30, 30], [200, 50, 10]), {}),
    # (a run of many prices: the real-KV term's rounding steps every 16 tokens here)
    "long decode runs": (([0.0, 0.0, 0.0, 40.0], [90, 3000, 120, 20], [6000, 4000, 5000, 9000]), {}),
    "one decode run of 52 prices": (([0.0], [1], [262_000]), {}),
}


@pytest.mark.parametrize("case", CASES)
def test_compiled_replay_matches_python_on_edges(case):
    (arrival, prompt, output), params = CASES[case]
    req = llm_requests(arrival, prompt, output)
    policy = PagedKV(**params)
    policy.reset(req)
    assert paged_kv_compiled.replay(policy, req, _cost()) is not None
    fast, *_ = _run(req, params, {}, True)
    slow, *_ = _run(req, params, {}, False)
    _assert_same(fast, slow)


def _busy_trace(n=300, seed=0):
    rng = np.random.default_rng(seed)
    return llm_requests(np.cumsum(rng.exponential(0.01, n)), rng.integers(50, 900, n), rng.integers(5, 300, n))


def test_replay_runs_where_covered_and_counts_preemptions():
    """A small cache without prefix caching preempts many times: covered, and the same."""
    req = _busy_trace()
    params = dict(num_gpu_blocks=120, enable_prefix_caching=False)
    policy = PagedKV(**params)
    policy.reset(req)
    replayed = paged_kv_compiled.replay(policy, req, _cost())
    assert replayed is not None and replayed["state"][paged_kv_compiled.S_PREEMPTIONS] > 10
    fast, *_ = _run(req, params, {}, True)
    slow, *_ = _run(req, params, {}, False)
    _assert_same(fast, slow)
    assert fast.stats["preemptions"] > 10


def test_preemption_with_prefix_caching_replays_block_ids():
    """Preempted blocks become findable by key: counts no longer decide, and the replay runs
    again keeping block ids, prefix cache and free queue, as the block manager does."""
    req = _busy_trace()
    policy = PagedKV(num_gpu_blocks=120)
    policy.reset(req)
    replayed = paged_kv_compiled.replay(policy, req, _cost())
    assert replayed is not None and replayed["state"][paged_kv_compiled.S_PREEMPTIONS] > 10
    fast, *_ = _run(req, dict(num_gpu_blocks=120), {}, True)
    slow, *_ = _run(req, dict(num_gpu_blocks=120), {}, False)
    _assert_same(fast, slow)
    assert fast.stats["preemptions"] > 0


def test_shared_prefixes_under_pressure():
    """Mooncake-like shared prefixes in a small cache: hits, evictions of cached blocks, blocks
    held by several requests, preemptions, all as the block manager has them."""
    rng = np.random.default_rng(5)
    n = 200
    prompt = rng.integers(100, 1200, n)
    hash_ids = [[int(f) * 1000 + j for j in range(-(-int(p) // 64))]
                for f, p in zip(rng.integers(0, 4, n), prompt)]
    req = llm_requests(np.cumsum(rng.exponential(0.02, n)), prompt, rng.integers(5, 200, n),
                       hash_ids=hash_ids, hash_block_tokens=64)
    params = dict(num_gpu_blocks=400)
    fast, *_ = _run(req, params, {}, True)
    slow, *_ = _run(req, params, {}, False)
    _assert_same(fast, slow)
    assert fast.prefix_hit_tokens.sum() > 0 and fast.stats["preemptions"] > 0


@pytest.mark.parametrize("case", ["linear cost", "priority", "swap", "subclass"])
def test_not_covered(case):
    params, cost = {}, _cost()
    if case == "linear cost":
        cost = LinearCost()
    elif case == "priority":
        params = dict(scheduling_policy="priority")
    elif case == "swap":
        params = dict(preemption_mode="swap")
    if case == "subclass":   # covered settings, but a subclass may decide otherwise
        policy = type("Sub", (PagedKV,), {})()
        policy.reset(llm_requests([0.0, 0.1], [600, 600], [5, 5]))
        assert paged_kv_compiled.covered(policy, cost) and policy.replay_compiled(policy.requests, cost) is None
        return
    policy = PagedKV(**params)
    policy.reset(llm_requests([0.0, 0.1], [600, 600], [5, 5]))
    assert not paged_kv_compiled.covered(policy, cost)
    assert policy.replay_compiled(policy.requests, cost) is None


def test_a_small_run_loads_no_replay():
    """Below COMPILED_FROM requests, a process that has not loaded the replay runs in Python
    (loading numba would cost more than the run); once loaded, any run is replayed."""
    code = """
import sys
from llm_helpers import llm_requests
from policies.paged_kv import PagedKV
from schedsim.core.llm_simulate import simulate_llm
from schedsim.cost.step_model import StepCostModel
from schedsim.cost.step_profile import load_step_profile
from schedsim.run.llm_runner import default_step_profile_path
cost = StepCostModel.from_profile(load_step_profile(default_step_profile_path()))
req = llm_requests([0.0, 0.1], [100, 200], [10, 20])
policy = PagedKV()
assert policy.replay_compiled(req, cost) is None and 'numba' not in sys.modules
policy.COMPILED_FROM = 2
policy.reset(req)
assert policy.replay_compiled(req, cost) is not None
policy = PagedKV()
policy.reset(req)
assert policy.replay_compiled(req, cost) is not None   # loaded now
print('ok')
"""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
