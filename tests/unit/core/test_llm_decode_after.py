"""A step that carries the decode run after it (:attr:`Step.then`: its rows all emit, none
finishes, nothing waits) runs with that run as one event, and gives every array of the
result bit for bit, and the same block tables, as deciding the run when the step ends."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from policies.paged_kv import PagedKV
from schedsim.core.llm_simulate import simulate_llm
from llm_helpers import LinearCost, OneStepAtATime, llm_requests


class Counting:
    """Counts a policy's decisions, and those that carry a decode run."""

    def reset(self, requests):
        super().reset(requests)
        self.decisions = self.carried = 0

    def schedule(self, now_ns):
        step = super().schedule(now_ns)
        self.decisions += 1
        self.carried += step.then is not None
        return step


class Merged(Counting, PagedKV):
    pass


class Unmerged(Counting, PagedKV):
    DECODE_AFTER = False


def arrays(result) -> dict:
    return {name: value.tolist() for name, value in vars(result).items() if isinstance(value, np.ndarray)}


def run(cls, req, params):
    policy = cls(**params)
    result = simulate_llm(req, policy, LinearCost())
    policy.kv.check()
    return result, policy


def test_an_admission_and_the_decodes_after_it_are_one_event():
    # B arrives while A decodes; its prompt goes in with A's next token, then both decode
    # until A finishes: that step and the run after it make one event.
    req = llm_requests([0.0, 0.002], prompt=[8, 8], output=[30, 40])
    params = dict(block_size=4, num_gpu_blocks=200, enable_prefix_caching=True)
    merged, m = run(Merged, req, params)
    unmerged, u = run(Unmerged, req, params)
    assert arrays(merged) == arrays(unmerged)
    assert m.kv.state() == u.kv.state()
    assert m.carried >= 1 and m.decisions < u.decisions
    stepwise = simulate_llm(req, OneStepAtATime(PagedKV(**params)), LinearCost())
    for name in ("status", "first_token_ns", "end_ns", "tokens_out"):
        assert np.array_equal(getattr(stepwise, name), getattr(merged, name)), name


def test_no_run_is_carried_past_a_finish_or_a_waiting_request():
    # B finishes with the step that admits it: no decode run after that step is carried.
    req = llm_requests([0.0, 0.002], prompt=[8, 8], output=[30, 1])
    params = dict(block_size=4, num_gpu_blocks=200)
    merged, m = run(Merged, req, params)
    unmerged, _ = run(Unmerged, req, params)
    assert arrays(merged) == arrays(unmerged)
    # One sequence at a time: a request waits behind the running one, nothing is carried.
    req = llm_requests([0.0, 0.001, 0.002], prompt=[8, 8, 8], output=[20, 5, 5])
    merged, m = run(Merged, req, dict(block_size=4, num_gpu_blocks=200, max_num_seqs=1))
    unmerged, _ = run(Unmerged, req, dict(block_size=4, num_gpu_blocks=200, max_num_seqs=1))
    assert arrays(merged) == arrays(unmerged)


traces = st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 0.03), min_size=n, max_size=n),
    st.lists(st.integers(1, 90), min_size=n, max_size=n),
    st.lists(st.integers(1, 60), min_size=n, max_size=n)))

engine = st.fixed_dictionaries({
    "block_size": st.sampled_from([2, 4, 16]), "num_gpu_blocks": st.integers(8, 300),
    "max_num_batched_tokens": st.integers(8, 256), "max_num_seqs": st.integers(1, 32),
    "enable_prefix_caching": st.booleans(), "long_prefill_token_threshold": st.sampled_from([0, 7]),
    "max_model_len": st.sampled_from([64, 160]), "vllm_compat": st.sampled_from(["0.8", "0.10", "current"]),
    "max_num_partial_prefills": st.sampled_from([None, 2])})


@hyp_settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces, params=engine)
def test_carried_runs_change_nothing(trace, params):
    gaps, prompt, output = trace
    req = llm_requests(np.cumsum(gaps), prompt, output)
    merged, m = run(Merged, req, params)
    unmerged, u = run(Unmerged, req, params)
    assert arrays(merged) == arrays(unmerged)
    assert merged.stats.keys() == unmerged.stats.keys()
    assert m.kv.state() == u.kv.state()
    assert m.decisions <= u.decisions
