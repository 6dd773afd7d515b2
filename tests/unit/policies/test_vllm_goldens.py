"""Golden step logs of the behaviours that tell today's vLLM scheduler from earlier releases.

Each test names the vLLM source (and test file) whose behaviour it reproduces, read at
vLLM main as of 2026 (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``,
vllm/v1/core/kv_cache_manager.py ``KVCacheManager.allocate_slots``,
vllm/v1/core/block_pool.py ``BlockPool.free_blocks``, vllm/v1/core/sched/request_queue.py,
vllm/config/scheduler.py; tests in tests/v1/core/test_scheduler.py and
test_prefix_caching.py). Where the older behaviour differs it is pinned beside it through
``vllm_compat="0.8"``. A log entry is ``([(row, tokens, context, emits), ...], repeat,
preempted rows)``, one per step.
"""

from __future__ import annotations

import pytest

from policies import PagedKV
from policies.kv_cache import KVCacheManager
from schedsim.core.llm_simulate import simulate_llm
from schedsim.core.results import COMPLETED, REJECTED_TOO_LONG
from schedsim.errors import InputError
from llm_helpers import LinearCost, llm_requests, step_log

A, B, C = 0, 1, 2


def run_steps(policy, requests, n_steps, arrive_at=None):
    """Decide and complete ``n_steps`` steps one at a time; ``arrive_at[row]`` is the step
    index (0-based) before which the row arrives (all before the first by default)."""
    arrive_at = arrive_at or [0] * len(requests)
    policy.reset(requests)
    delivered, logs = 0, []
    for t in range(n_steps):
        stop = delivered
        while stop < len(requests) and arrive_at[stop] <= t:
            stop += 1
        if stop > delivered:
            policy.on_arrivals(t, delivered, stop)
            delivered = stop
        step = policy.schedule(t)
        logs.append((step_log(step), step.repeat, [int(r) for r in step.preempted]))
        if len(step):
            policy.on_step_done(t, step, 1)
    policy.kv.check()
    return logs


def paged(compat="current", **kw):
    kw.setdefault("enable_prefix_caching", False)
    return PagedKV(vllm_compat=compat, block_size=4, **kw)


# --- whole-prompt admission ---------------------------------------------------------------

def test_whole_prompt_admission_waits_until_the_whole_sequence_fits():
    # scheduler.py: the waiting loop calls allocate_slots(full_sequence_must_fit=
    # self.scheduler_reserve_full_isl); kv_cache_manager.py: the request's whole known
    # length (min(num_tokens, max_model_len)) must fit, though only its chunk is allocated.
    # 8 usable blocks, 8 tokens a step; B's 24-token prompt needs 6 blocks, A holds 3.
    req = llm_requests([0, 0], prompt=[12, 24], output=[2, 1])
    assert run_steps(paged(num_gpu_blocks=9, max_num_batched_tokens=8), req, 6) == [
        ([(A, 8, 0, False)], 1, []),
        ([(A, 4, 8, True)], 1, []),            # 4 tokens of budget left, but B's 6 blocks do not fit
        ([(A, 1, 12, True)], 1, []),           # A finishes
        ([(B, 8, 0, False)], 1, []),
        ([(B, 8, 8, False)], 1, []),
        ([(B, 8, 16, True)], 1, []),
    ]
    # Before: admitted as soon as its first chunk fits.
    assert run_steps(paged("0.8", num_gpu_blocks=9, max_num_batched_tokens=8), req, 5) == [
        ([(A, 8, 0, False)], 1, []),
        ([(A, 4, 8, True), (B, 4, 0, False)], 1, []),
        ([(A, 1, 12, True), (B, 7, 4, False)], 1, []),
        ([(B, 8, 11, False)], 1, []),
        ([(B, 5, 19, True)], 1, []),
    ]


def test_whole_prompt_admission_is_a_switch():
    req = llm_requests([0, 0], prompt=[12, 24], output=[2, 1])
    off = run_steps(paged(num_gpu_blocks=9, max_num_batched_tokens=8, scheduler_reserve_full_isl=False), req, 5)
    assert off == run_steps(paged("0.8", num_gpu_blocks=9, max_num_batched_tokens=8), req, 5)


# --- free-block order -----------------------------------------------------------------------

def test_freed_blocks_without_a_hash_go_to_the_head_of_the_free_queue():
    # block_pool.py BlockPool.free_blocks: blocks reaching ref 0 (given tail first by the
    # manager's free) are split: no hash -> free_block_queue.prepend_n (reused first), a
    # hash -> append_n (LRU tail); kv_cache_utils.py FreeKVCacheBlockQueue.prepend_n.
    kv = KVCacheManager(9, 4, enable_prefix_caching=True, free_unhashed_first=True)
    kv.allocate("a", 10)
    kv.cache_blocks("a", 2, ["k0", "k1"])   # a's two full blocks are hashed; block 3 is partial
    kv.allocate("b", 5)
    assert (kv.blocks_of("a"), kv.blocks_of("b"), kv.free_block_ids()) == ([1, 2, 3], [4, 5], [6, 7, 8])
    kv.free("a")
    assert kv.free_block_ids() == [3, 6, 7, 8, 2, 1]
    kv.free("b")
    assert kv.free_block_ids() == [5, 4, 3, 6, 7, 8, 2, 1]
    kv.allocate("c", 8)
    assert kv.blocks_of("c") == [5, 4] and kv.cached_key(2) == "k1"   # the cached blocks survive
    kv.check()
    # Before: every freed block to the tail, tail blocks first.
    old = KVCacheManager(9, 4, enable_prefix_caching=True)
    old.allocate("a", 10)
    old.cache_blocks("a", 2, ["k0", "k1"])
    old.allocate("b", 5)
    old.free("a")
    old.free("b")
    assert old.free_block_ids() == [6, 7, 8, 3, 2, 1, 5, 4]


def test_lazily_keyed_full_blocks_count_as_hashed():
    # A caller that registers keys late says how many leading blocks are full (num_hashed):
    # they go to the tail as vLLM's hashed blocks do; the partial one to the head.
    kv = KVCacheManager(9, 4, enable_prefix_caching=True, free_unhashed_first=True)
    kv.allocate("a", 10)
    kv.free("a", num_hashed=2)
    assert kv.free_block_ids() == [3, 4, 5, 6, 7, 8, 2, 1]
    # With prefix caching off no block has a hash: all go to the head, reused LIFO.
    off = KVCacheManager(9, 4, free_unhashed_first=True)
    off.allocate("a", 10)
    off.free("a")
    assert off.free_block_ids() == [3, 2, 1, 4, 5, 6, 7, 8]


# --- watermark --------------------------------------------------------------------------------

def test_watermark_applies_only_to_admissions_beside_running_requests():
    # kv_cache_manager.py allocate_slots: watermark_blocks only when has_scheduled_reqs
    # (the scheduler passes bool(self.running)) and the request is WAITING or PREEMPTED.
    # 8 usable blocks, watermark 0.25 of 9 = 2 blocks. A's 25-token prompt takes 7 blocks.
    req = llm_requests([0, 0], prompt=[25, 3], output=[2, 1])
    assert run_steps(paged(num_gpu_blocks=9, watermark=0.25), req, 4) == [
        ([(A, 25, 0, True)], 1, []),           # nothing runs: no watermark
        ([(A, 1, 25, True)], 1, []),           # B needs 1 block + 2 of watermark; 1 is free
        ([(B, 3, 0, True)], 1, []),
        ([], 1, []),
    ]
    # Before: the watermark held for every admission, so A never fits and B waits behind it.
    assert run_steps(paged("0.8", num_gpu_blocks=9, watermark=0.25), req, 2) == [([], 1, []), ([], 1, [])]


# --- requests longer than the cache -----------------------------------------------------------

def test_a_request_longer_than_the_cache_runs_and_stops_at_the_limit():
    # The request's prompt and one token fit; its generation stops when its KV reaches the
    # cache (16 tokens here): 16 + 1 - 12 = 5 tokens, reported as length_capped.
    policy = paged(num_gpu_blocks=5)
    result = simulate_llm(llm_requests([0], [12], [10]), policy, LinearCost())
    assert result.status.tolist() == [COMPLETED] and result.tokens_out.tolist() == [5]
    assert result.stats["length_capped"] == 1
    # And at max_model_len: 14 - 10 = 4 tokens.
    policy = paged(num_gpu_blocks=5, max_model_len=14)
    result = simulate_llm(llm_requests([0], [10], [10]), policy, LinearCost())
    assert result.tokens_out.tolist() == [4] and result.stats["length_capped"] == 1
    # A prompt that does not fit with one token is still refused; before, any that overran.
    policy = paged(num_gpu_blocks=5)
    assert simulate_llm(llm_requests([0], [17], [2]), policy, LinearCost()).status.tolist() == [REJECTED_TOO_LONG]
    edge = simulate_llm(llm_requests([0], [16], [2]), paged(num_gpu_blocks=5), LinearCost())
    assert edge.status.tolist() == [COMPLETED] and edge.tokens_out.tolist() == [1]
    old = simulate_llm(llm_requests([0], [12], [10]), paged("0.8", num_gpu_blocks=5), LinearCost())
    assert old.status.tolist() == [REJECTED_TOO_LONG] and old.tokens_out.tolist() == [0]


# --- priority scheduling -------------------------------------------------------------------

def test_priority_orders_the_waiting_queue_by_priority_then_arrival():
    # request_queue.py PriorityRequestQueue: a heap of (priority, arrival_time); lower first.
    req = llm_requests([0, 0, 0], prompt=[4, 4, 4], output=[1, 1, 1], priority=[1, 0, 1])
    logs = run_steps(paged(num_gpu_blocks=64, max_num_seqs=1, scheduling_policy="priority"), req, 3)
    assert [log[0][0][0] for log in logs] == [B, A, C]
    logs = run_steps(paged(num_gpu_blocks=64, max_num_seqs=1), req, 3)
    assert [log[0][0][0] for log in logs] == [A, B, C]


def test_priority_preempts_the_lowest_priority_running_request_even_itself():
    # scheduler.py: when allocate_slots fails, PRIORITY preempts max(running, key=(priority,
    # arrival_time)), FCFS running.pop(). A (priority 1) runs first; B (priority 0) comes a
    # step later. 4 usable blocks; at A's 9th token no block is free.
    req = llm_requests([0, 0], prompt=[6, 6], output=[6, 3], priority=[1, 0])
    assert run_steps(paged(num_gpu_blocks=5, scheduling_policy="priority"), req, 7, arrive_at=[0, 1]) == [
        ([(A, 6, 0, True)], 1, []),
        ([(A, 1, 6, True), (B, 6, 0, True)], 1, []),
        ([(A, 1, 7, True), (B, 1, 6, True)], 1, []),
        # A is the lowest priority: it preempts itself; B runs in the same step.
        ([(B, 1, 7, True)], 1, [A]),
        ([(A, 9, 0, True)], 1, []),            # A recomputes prompt + 3 tokens, emits its 4th
        ([(A, 1, 9, True)], 2, []),            # a run of 2 identical decodes, taken one by one
        ([(A, 1, 10, True)], 1, []),
    ]
    # FCFS preempts the last running request, B.
    assert run_steps(paged(num_gpu_blocks=5), req, 4, arrive_at=[0, 1])[3] == ([(A, 1, 8, True)], 1, [B])


def test_a_priority_victim_scheduled_earlier_in_the_step_gives_its_tokens_back():
    # scheduler.py: a preempted request already in scheduled_running_reqs is removed from
    # them and its num_scheduled_tokens return to the token budget (req_index -= 1).
    req = llm_requests([0, 0], prompt=[6, 8], output=[4, 3], priority=[2, 0])
    assert run_steps(paged(num_gpu_blocks=5, scheduling_policy="priority"), req, 6, arrive_at=[0, 1]) == [
        ([(A, 6, 0, True)], 1, []),
        ([(A, 1, 6, True), (B, 8, 0, True)], 1, []),
        # A's decode fit its block and was scheduled; B's needs one: A is the victim.
        ([(B, 1, 8, True)], 1, [A]),
        ([(B, 1, 9, True)], 1, []),
        ([(A, 8, 0, True)], 1, []),
        ([(A, 1, 8, True)], 1, []),
    ]


# --- chunked prefill off, long prefills, partial prefills ---------------------------------

def test_without_chunked_prefill_a_prompt_runs_whole_or_waits_and_blocks_the_queue():
    # scheduler.py waiting loop: if not enable_chunked_prefill and num_new_tokens >
    # token_budget: break (nothing behind it is admitted either).
    req = llm_requests([0, 0, 0], prompt=[10, 10, 3], output=[1, 1, 1])
    assert run_steps(paged(num_gpu_blocks=64, max_num_batched_tokens=16, max_model_len=16,
                           enable_chunked_prefill=False), req, 2) == [
        ([(A, 10, 0, True)], 1, []),           # B (10) is over the 6 left; C (3) would fit but waits
        ([(B, 10, 0, True), (C, 3, 0, True)], 1, []),
    ]
    assert run_steps(paged(num_gpu_blocks=64, max_num_batched_tokens=16, max_model_len=16), req, 2) == [
        ([(A, 10, 0, True), (B, 6, 0, False)], 1, []),
        ([(B, 4, 6, True), (C, 3, 0, True)], 1, []),
    ]


def test_without_chunked_prefill_the_budget_must_hold_a_whole_prompt():
    # vllm/config/scheduler.py: max_num_batched_tokens < max_model_len is refused when
    # chunked prefill is off; left unset it becomes max(max_model_len, 2048).
    with pytest.raises(InputError, match="--max-num-batched-tokens"):
        paged(num_gpu_blocks=64, max_num_batched_tokens=16, max_model_len=32, enable_chunked_prefill=False)
    assert paged(num_gpu_blocks=64, max_model_len=4096, enable_chunked_prefill=False).max_num_batched_tokens == 4096
    assert paged(num_gpu_blocks=64, max_model_len=512, enable_chunked_prefill=False).max_num_batched_tokens == 2048


def test_long_prefill_threshold_and_one_partial_prefill_at_a_time():
    # scheduler.py: 0 < long_prefill_token_threshold < num_new_tokens caps a chunk;
    # max_num_partial_prefills (vLLM V0's; V1 does not apply it) lets one prompt be
    # prefilled at a time: B waits until A's prompt is in.
    req = llm_requests([0, 0], prompt=[7, 6], output=[1, 1])
    assert run_steps(paged(num_gpu_blocks=64, long_prefill_token_threshold=4, max_num_partial_prefills=1),
                     req, 4) == [
        ([(A, 4, 0, False)], 1, []),
        ([(A, 3, 4, True)], 1, []),
        ([(B, 4, 0, False)], 1, []),
        ([(B, 2, 4, True)], 1, []),
    ]
    assert run_steps(paged(num_gpu_blocks=64, long_prefill_token_threshold=4), req, 2) == [
        ([(A, 4, 0, False), (B, 4, 0, False)], 1, []),
        ([(A, 3, 4, True), (B, 2, 4, True)], 1, []),
    ]


# --- prefix caching on by default ---------------------------------------------------------

def test_prefix_caching_is_on_by_default():
    # vllm/config/cache.py: enable_prefix_caching defaults to True in vLLM V1.
    req = llm_requests([0, 0.01], [9, 9], [1, 1], hash_ids=[[1, 2, 3], [1, 2, 4]], hash_block_tokens=4)
    policy = PagedKV(block_size=4, num_gpu_blocks=16)
    assert policy.prefix_caching and policy.settings()["enable_prefix_caching"] is True
    assert simulate_llm(req, policy, LinearCost()).prefix_hit_tokens.tolist() == [0, 8]
    old = PagedKV(vllm_compat="0.8", block_size=4, num_gpu_blocks=16)
    assert simulate_llm(req, old, LinearCost()).prefix_hit_tokens.tolist() == [0, 0]


def test_presets_and_bad_values():
    assert PagedKV(num_gpu_blocks=64).settings() | {} == {
        "vllm_compat": "current", "scheduler_reserve_full_isl": True, "async_scheduling": True,
        "scheduling_policy": "fcfs", "enable_chunked_prefill": True, "enable_prefix_caching": True,
        "long_prefill_token_threshold": 0, "max_num_partial_prefills": None, "max_num_batched_tokens": 8192}
    old = PagedKV(vllm_compat="0.8", num_gpu_blocks=64).settings()
    assert (old["scheduler_reserve_full_isl"], old["async_scheduling"], old["enable_prefix_caching"]) == (False,) * 3
    mid = PagedKV(vllm_compat="0.10", num_gpu_blocks=64).settings()
    assert (mid["scheduler_reserve_full_isl"], mid["async_scheduling"], mid["enable_prefix_caching"]) == (False, False, True)
    for kw, flag in ((dict(vllm_compat="0.9"), "--vllm-compat"), (dict(scheduling_policy="lifo"), "--scheduling-policy"),
                     (dict(max_num_partial_prefills=0), "--max-num-partial-prefills")):
        with pytest.raises(InputError, match=flag):
            PagedKV(num_gpu_blocks=64, **kw)
