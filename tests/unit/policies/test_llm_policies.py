"""Golden step logs of the LLM policies on hand-made scenarios (no simulator, no GPU).

Each test drives a policy as a driver would (arrivals, schedule, step done) and asserts
the exact steps it decides, as vLLM's CPU scheduler tests do.
"""

from __future__ import annotations

import numpy as np
import pytest

from policies import Continuous, PagedKV, StaticLLM
from schedsim.errors import InputError
from llm_helpers import llm_requests, step_log

A, B, C = 0, 1, 2


def run_steps(policy, requests, n_steps, repeats_of=lambda step: 1):
    """Arrive everything at 0, then decide and complete ``n_steps`` steps; return their logs."""
    policy.reset(requests)
    policy.on_arrivals(0, 0, len(requests))
    logs = []
    for t in range(1, n_steps + 1):
        step = policy.schedule(t)
        k = repeats_of(step)
        logs.append((step_log(step), step.repeat, [int(r) for r in step.preempted]))
        if len(step):
            policy.on_step_done(t, step, k)
    return logs


def test_admission_and_chunked_prefill():
    policy = PagedKV(vllm_compat="0.8", block_size=4, num_gpu_blocks=64, max_num_batched_tokens=8, max_num_seqs=4)
    req = llm_requests([0, 0], prompt=[10, 5], output=[3, 2])
    logs = run_steps(policy, req, 5)
    assert logs == [
        ([(A, 8, 0, False)], 1, []),                    # A's prompt chunked at the budget
        ([(A, 2, 8, True), (B, 5, 0, True)], 1, []),    # A finishes prefill; B fits in the rest
        ([(A, 1, 10, True), (B, 1, 5, True)], 1, []),   # both decode; B's second token ends it
        ([(A, 1, 11, True)], 1, []),
        ([], 1, []),                                    # all done
    ]
    assert policy.kv.num_used_blocks == 0


def test_block_boundary_preemption_and_recompute():
    # 4 usable blocks of 4 tokens: two 6-token prompts take them all.
    policy = PagedKV(vllm_compat="0.8", block_size=4, num_gpu_blocks=5, max_num_batched_tokens=100)
    req = llm_requests([0, 0], prompt=[6, 6], output=[4, 4])
    logs = run_steps(policy, req, 5, repeats_of=lambda s: s.repeat)
    assert logs == [
        ([(A, 6, 0, True), (B, 6, 0, True)], 1, []),
        # Both decode within their second block: 2 identical steps before one needs a block.
        ([(A, 1, 6, True), (B, 1, 6, True)], 2, []),
        # A's 9th token needs a third block: the last running request (B) is preempted.
        ([(A, 1, 8, True)], 1, [B]),
        # B recomputes its prompt and the 3 tokens it had generated, then emits its 4th.
        ([(B, 9, 0, True)], 1, []),
        ([], 1, []),
    ]
    assert policy.stats()["preemptions"] == 1
    assert policy.kv.num_used_blocks == 0


def test_preempting_itself_when_alone_is_not_possible_so_longest_fits():
    # A request that needs every block runs; one that cannot ever fit is rejected on arrival.
    policy = PagedKV(vllm_compat="0.8", block_size=4, num_gpu_blocks=5, max_num_batched_tokens=100)
    req = llm_requests([0, 0], prompt=[12, 20], output=[5, 1])
    policy.reset(req)
    policy.on_arrivals(0, 0, 2)
    step = policy.schedule(1)
    assert [int(r) for r in step.rejects[0].rows] == [B] and step.rejects[0].reason == "too_long"
    assert step_log(step) == [(A, 12, 0, True)]


def test_prefix_hit_reuses_a_finished_requests_blocks():
    policy = PagedKV(vllm_compat="0.8", block_size=4, num_gpu_blocks=16, enable_prefix_caching=True)
    # hash ids name 4-token blocks here; B shares A's first two blocks.
    req = llm_requests([0, 0], prompt=[9, 9], output=[1, 1], hash_ids=[[1, 2, 3], [1, 2, 4]],
                       hash_block_tokens=4)
    policy.reset(req)
    policy.on_arrivals(0, 0, 1)
    step = policy.schedule(0)
    assert step_log(step) == [(A, 9, 0, True)]
    policy.on_step_done(1, step, 1)          # A finishes; its 2 full blocks stay cached
    policy.on_arrivals(1, 1, 2)
    step = policy.schedule(1)
    assert step_log(step) == [(B, 1, 8, True)]   # 8 of B's 9 prompt tokens were cached
    assert int(policy.stats()["prefix_hit_tokens_per_request"][B]) == 8


def test_a_preempted_request_re_hits_its_own_blocks():
    policy = PagedKV(vllm_compat="0.8", block_size=4, num_gpu_blocks=7, max_num_batched_tokens=100,
                     enable_prefix_caching=True)
    req = llm_requests([0, 0], prompt=[8, 8], output=[6, 6])
    logs = run_steps(policy, req, 4, repeats_of=lambda s: s.repeat)
    # Step 3: A needs a 4th block with none free; B (the last running) is preempted. B's two
    # full prompt blocks stay cached in the free queue, then A's allocation evicts one of
    # them (LRU head); B re-hits what is left when it comes back.
    assert logs[0] == ([(A, 8, 0, True), (B, 8, 0, True)], 1, [])
    assert logs[2][2] == [B]
    assert logs[3][0][0][0] == B and logs[3][0][0][2] > 0   # B resumes from cached context


def test_swap_out_and_in():
    policy = PagedKV(vllm_compat="0.8", block_size=4, num_gpu_blocks=5, max_num_batched_tokens=100,
                     preemption_mode="swap", swap_space_gb=0.001, watermark=0.0)
    req = llm_requests([0, 0], prompt=[6, 6], output=[4, 4])
    policy.reset(req)
    policy.on_arrivals(0, 0, 2)
    steps = []
    for t in range(1, 6):
        step = policy.schedule(t)
        steps.append((step_log(step), [int(r) for r in step.preempted], step.swap_out_blocks,
                      step.swap_in_blocks))
        if len(step):
            policy.on_step_done(t, step, step.repeat)
    assert steps == [
        ([(A, 6, 0, True), (B, 6, 0, True)], [], 0, 0),
        ([(A, 1, 6, True), (B, 1, 6, True)], [], 0, 0),
        ([(A, 1, 8, True)], [B], 2, 0),       # B's 2 blocks go to host memory
        ([(B, 1, 8, True)], [], 0, 2),        # and come back: no recompute
        ([], [], 0, 0),
    ]
    assert policy.stats()["swaps_out"] == 1


def test_continuous_reserves_max_length_and_admits_fcfs():
    # 8 usable blocks of 4 tokens = 32 tokens; each request reserves max_model_len = 16.
    policy = Continuous(reservation="max", block_size=4, num_gpu_blocks=9, max_model_len=16)
    req = llm_requests([0, 0, 0], prompt=[3, 3, 3], output=[2, 4, 2])
    logs = run_steps(policy, req, 5, repeats_of=lambda s: s.repeat)
    assert logs == [
        ([(A, 3, 0, True), (B, 3, 0, True)], 1, []),       # two reservations fill the memory
        ([(A, 1, 3, True), (B, 1, 3, True)], 1, []),       # A ends: its reservation frees
        ([(B, 1, 4, True), (C, 3, 0, True)], 1, []),       # C admitted, whole prompt at once
        ([(B, 1, 5, True), (C, 1, 3, True)], 1, []),
        ([], 1, []),
    ]


@pytest.mark.parametrize("mode,expected", [("max", 1), ("pow2", 2), ("oracle", 3)])
def test_reservation_modes_set_concurrency(mode, expected):
    # 15 usable blocks of 4 tokens = 60 tokens; prompts 10, outputs 9 (pow2 -> 16).
    policy = Continuous(reservation=mode, block_size=4, num_gpu_blocks=16, max_model_len=40)
    req = llm_requests([0, 0, 0], prompt=[10, 10, 10], output=[9, 9, 9])
    policy.reset(req)
    policy.on_arrivals(0, 0, 3)
    assert len(policy.schedule(0)) == expected


def test_static_batch_keeps_finished_members_as_padding():
    policy = StaticLLM(batch_size=2, block_size=4, num_gpu_blocks=64, max_model_len=32)
    req = llm_requests([0, 0, 0], prompt=[3, 5, 2], output=[1, 3, 1])
    logs = run_steps(policy, req, 4, repeats_of=lambda s: s.repeat)
    assert logs == [
        ([(A, 3, 0, True), (B, 5, 0, True)], 1, []),
        # A is done after its first token but stays in the batch as padding until B ends.
        ([(A, 1, 3, False), (B, 1, 5, True)], 2, []),
        ([(C, 2, 0, True)], 1, []),
        ([], 1, []),
    ]


def test_bad_flags_are_input_errors():
    with pytest.raises(InputError, match="--preemption-mode"):
        PagedKV(vllm_compat="0.8", preemption_mode="drop")
    with pytest.raises(InputError, match="--reservation"):
        Continuous(reservation="half")
    with pytest.raises(InputError, match="--max-num-seqs"):
        PagedKV(vllm_compat="0.8", max_num_seqs=0)


def test_trace_without_token_columns_is_an_input_error():
    policy = PagedKV(vllm_compat="0.8", num_gpu_blocks=64)
    req = llm_requests([0, 0], prompt=[0, 0], output=[0, 0])
    with pytest.raises(InputError, match="output_tokens"):
        policy.reset(req)


def test_a_one_token_prefill_chunk_is_not_repeated_as_a_decode():
    """Found by hypothesis: with the budget squeezed to one token, a prefilling row computes
    one token a step and emits nothing; such a step must not be marked repeatable."""
    policy = PagedKV(vllm_compat="0.8", block_size=2, num_gpu_blocks=9, max_num_batched_tokens=4, max_num_seqs=4,
                     max_model_len=64)
    req = llm_requests([0] * 4, prompt=[1, 1, 1, 3], output=[4, 4, 4, 2])
    logs = run_steps(policy, req, 4, repeats_of=lambda s: s.repeat)
    assert logs[1] == ([(A, 1, 1, True), (B, 1, 1, True), (C, 1, 1, True), (3, 1, 1, False)], 1, [])
    assert logs[2][0][3] == (3, 1, 2, True)   # its prompt is in: now it emits
