"""Shared by the live LLM engine tests (tests/unit/live/test_llm_*.py): llama-tiny and its
draft on the CPU in float32, torch on one thread, and the policy cases the driver runs."""

from __future__ import annotations

import pytest

BS = 8
"""Small KV blocks: every test crosses block boundaries."""

CASES = {
    "paged-recompute": ("paged-kv", dict(num_blocks=24, max_num_seqs=8, max_num_batched_tokens=96)),
    "paged-swap": ("paged-kv", dict(num_blocks=24, max_num_seqs=8, max_num_batched_tokens=96,
                                    preemption_mode="swap", swap_space_gb=0.02)),
    "paged-recompute-0.8": ("paged-kv", dict(num_blocks=24, max_num_seqs=8, max_num_batched_tokens=96,
                                             vllm_compat="0.8")),
    "continuous": ("continuous", dict(num_blocks=40, max_num_seqs=8, reservation="oracle")),
    "static": ("llm-static", dict(num_blocks=60, batch_size=4, reservation="oracle")),
}
"""(policy, parameters) the live driver is checked under: recompute and swap preemptions
under a small KV budget, the 0.8 preset, and the two reserving policies."""


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """torch on one thread for the module: on the tiny model more threads only contend."""
    torch = pytest.importorskip("torch")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def models():
    """(llama-tiny, its draft model), seeded 0 and 1 (the draft engine's seed beside a target's)."""
    torch = pytest.importorskip("torch")
    from schedsim.live.engines.decoder import DRAFT_MODELS, build_decoder

    return (build_decoder("llama-tiny", "cpu", torch.float32, seed=0),
            build_decoder(DRAFT_MODELS["llama-tiny"], "cpu", torch.float32, seed=1))
