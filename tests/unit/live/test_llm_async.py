"""The live LLM loop overlapped as under async scheduling (run_live_llm(overlap=True)), on
llama-tiny, CPU float32: each step is formed, and packed, while the one before runs on a
worker thread. Every request arrives at t=0, so the decisions cannot depend on timing: the
overlapped run must take the same steps and generate the same tokens as the serial one."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from schedsim.core.results import COMPLETED  # noqa: E402
from schedsim.live.engines.decoder import DRAFT_MODELS  # noqa: E402
from schedsim.live.engines.llm_engine import PagedLLMEngine  # noqa: E402
from schedsim.live.engines.null_engine import NullLLMEngine  # noqa: E402
from schedsim.live.llm_driver import run_live_llm  # noqa: E402
from schedsim.registry import build_policy  # noqa: E402
from live_llm_helpers import BS, CASES as DRIVER_CASES, models, one_thread  # noqa: E402,F401  (fixtures)
from llm_helpers import llm_requests  # noqa: E402

SPEC = json.dumps({"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": 0.7, "seed": 2})
CASES = {k: v for k, v in DRIVER_CASES.items() if k != "paged-recompute-0.8"} | {
    "paged-priority": ("paged-kv", dict(num_blocks=24, max_num_seqs=8, max_num_batched_tokens=96,
                                        scheduling_policy="priority")),
    "paged-speculative": ("paged-kv", dict(num_blocks=24, max_num_seqs=8, max_num_batched_tokens=96,
                                           speculative_config=SPEC)),
}


def burst(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return llm_requests(np.zeros(n), rng.integers(10, 70, n), rng.integers(3, 25, n), priority=rng.integers(0, 3, n))


def run(models, req, name, num_blocks, overlap, **params):
    policy = build_policy(name, {"block_size": BS, "num_gpu_blocks": num_blocks} | params)
    with PagedLLMEngine("llama-tiny", num_blocks, BS, "cpu", torch.float32, model=models[0], max_context=256) as eng:
        draft = None
        if policy.speculative is not None:
            draft = PagedLLMEngine(DRAFT_MODELS["llama-tiny"], num_blocks, BS, "cpu", torch.float32,
                                   model=models[1], max_context=256).__enter__()
        try:
            return run_live_llm(req, policy, eng, keep_tokens=True, start_delay_s=0.0, draft=draft, overlap=overlap)
        finally:
            if draft is not None:
                draft.__exit__(None, None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_overlapped_loop_takes_the_serial_loops_steps_and_tokens(models, case):
    name, params = CASES[case]
    req = burst()
    serial, s_extra = run(models, req, name, overlap=False, **params)
    over, o_extra = run(models, req, name, overlap=True, **params)
    assert o_extra["options"]["overlap"] is True and s_extra["options"]["overlap"] is False
    assert o_extra["failed_steps"] == 0 and not o_extra["partial"]
    assert (over.status == COMPLETED).all()
    np.testing.assert_array_equal(over.tokens_out, req.output_tokens)
    for key in ("step_seqs", "step_tokens", "step_prefill_tokens", "step_preempted", "step_kv_blocks"):
        np.testing.assert_array_equal(getattr(over, key), getattr(serial, key), err_msg=key)
    np.testing.assert_array_equal(over.preemptions, serial.preemptions)
    for r in range(len(req)):
        np.testing.assert_array_equal(o_extra["tokens"].tokens(r), s_extra["tokens"].tokens(r), err_msg=f"row {r}")
    if case == "paged-swap":
        assert o_extra["swaps"]["out_blocks"] == o_extra["swaps"]["in_blocks"] > 0
    # Steps are logged in order and do not overlap in the result; forming overlapped the step before.
    assert (np.diff(over.step_start_ns) >= 0).all() and (over.step_start_ns[1:] >= over.step_end_ns[:-1]).all()
    assert s_extra["overlap_ms"]["max"] == 0 and o_extra["overlap_ms"]["max"] > 0


def test_overlap_needs_an_engine_that_packs_steps_apart(models):
    req = burst(n=2)
    policy = build_policy("paged-kv", {"block_size": BS, "num_gpu_blocks": 24})
    with pytest.raises(ValueError, match="prepare, run and set_tokens"):
        run_live_llm(req, policy, NullLLMEngine(24, BS, 256), engine_warmup=False, overlap=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", ["paged-recompute", "paged-speculative"])
def test_overlapped_loop_on_cuda_graphs_takes_the_serial_loops_tokens(case):
    """On CUDA the overlapped loop packs a decode step for a graph replay while the step
    before runs, and writes the placeholders in before the replay copies its inputs."""
    from schedsim.live.engines.decoder import build_decoder
    from schedsim.live.engines.llm_engine import draft_engine

    name, params = CASES[case]
    model = build_decoder("llama-tiny", "cuda", torch.float32, seed=0)
    req = burst(n=16)
    out = {}
    for overlap in (False, True):
        policy = build_policy(name, {"block_size": BS, "num_gpu_blocks": 24} | {k: v for k, v in params.items()
                                                                                 if k != "num_blocks"})
        with PagedLLMEngine("llama-tiny", 24, BS, "cuda", torch.float32, model=model, cuda_graphs=True,
                            max_context=256) as eng:
            draft = draft_engine(eng) if policy.speculative is not None else None
            if draft is not None:
                draft.__enter__()
            try:
                result, extra = run_live_llm(req, policy, eng, keep_tokens=True, draft=draft, overlap=overlap)
            finally:
                if draft is not None:
                    draft.__exit__(None, None, None)
        assert (result.status == COMPLETED).all() and extra["graph_steps"] > 0
        out[overlap] = (result, extra["tokens"])
    np.testing.assert_array_equal(out[True][0].step_tokens, out[False][0].step_tokens)
    for r in range(len(req)):
        np.testing.assert_array_equal(out[True][1].tokens(r), out[False][1].tokens(r), err_msg=f"row {r}")
