"""paged-kv registers request-own prefix keys only when its blocks could be found again.

A block keyed by its own request (no hash id covers it) can be hit only by that request
after a preemption, so ``PagedKV._cache_full_blocks`` puts its registration off until the
request gives its blocks back, and a request whose keys are all its own looks up none of
them at its first admission. Here a policy that registers every full block at once and
looks up every admission's keys, as vLLM does, must schedule the same steps over the same
block ids with the same hits, under heavy preemption (recompute and swap), with shared
hash-id prefixes, and with hash ids only one request has (registered as lazily as its own keys).
"""

from __future__ import annotations

import numpy as np
import pytest

from policies.kv_cache import KVCacheManager
from policies.paged_kv import PagedKV
from schedsim.core.llm_simulate import simulate_llm
from llm_helpers import LinearCost, llm_requests


class EagerPagedKV(PagedKV):
    VECTOR_ROWS = 1 << 30   # row by row: every row that fills a block registers it there
    LOOKUP_EVERY_ADMISSION = True   # and every admission looks its prompt up

    def _cache_full_blocks(self, r: int, num_full: int) -> None:
        self.full[r] = max(self.full[r], num_full)
        self.kv.cache_blocks(r, num_full, self._keys(r))


class CountingKV(KVCacheManager):
    """Counts every prefix hit, re-admissions after a preemption included."""

    __slots__ = ("all_hits",)

    def computed_prefix(self, req, keys, num_tokens, count=True):
        hits = super().computed_prefix(req, keys, num_tokens, count)
        self.all_hits = getattr(self, "all_hits", 0) + hits
        return hits


class Recorded:
    """Wraps a policy: logs each step with the block table of every row in it."""

    def __init__(self, policy):
        self.policy, self.log = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def schedule(self, now_ns):
        step = self.policy.schedule(now_ns)
        kv = self.policy.kv
        self.log.append((now_ns, step.rows.tolist(), step.num_tokens.tolist(), step.context.tolist(),
                         [tuple(kv.blocks_of(r)) for r in step.rows.tolist()], kv.num_free_blocks,
                         kv.hit_tokens, kv.queried_tokens))
        return step

    def on_arrivals(self, now_ns, first, stop):
        self.policy.on_arrivals(now_ns, first, stop)

    def on_step_done(self, now_ns, step, repeats):
        self.policy.on_step_done(now_ns, step, repeats)


def workload(seed: int, hashed: bool):
    rng = np.random.default_rng(seed)
    n = 120
    arrival = np.cumsum(rng.exponential(0.004, n))
    prompt = rng.integers(1, 300, n)
    output = rng.integers(1, 120, n)
    ids = None
    if hashed:   # a few shared prefixes of 32-token hash blocks, some prompts partly covered
        families = [list(range(100 * f, 100 * f + 10)) for f in range(3)]
        ids = [families[int(rng.integers(3))][:int(rng.integers(0, -(-int(p) // 32) + 1))] for p in prompt]
    if hashed == "tails":   # and the rest of each prompt under hash ids no other request has (Mooncake)
        ids = [s + [1000 + 100 * i + j for j in range(len(s), -(-int(p) // 32))]
               for i, (s, p) in enumerate(zip(ids, prompt))]
    return llm_requests(arrival, prompt, output, hash_ids=ids, hash_block_tokens=32)


@pytest.mark.parametrize("compat", ["0.8", "current"])
@pytest.mark.parametrize("hashed", [False, True, "tails"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("seed", range(4))
def test_lazy_own_key_registration_changes_nothing(seed, mode, hashed, compat, monkeypatch):
    monkeypatch.setattr("policies.paged_kv.KVCacheManager", CountingKV)
    req = workload(seed, hashed)
    params = dict(block_size=8, num_gpu_blocks=90, max_num_seqs=24, max_num_batched_tokens=256,
                  enable_prefix_caching=True, preemption_mode=mode, swap_space_gb=0.005,
                  max_model_len=4096, vllm_compat=compat)
    runs = []
    for cls in (PagedKV, EagerPagedKV):
        policy = Recorded(cls(**params))
        result = simulate_llm(req, policy, LinearCost())
        policy.kv.check()
        runs.append((policy, result))
    (lazy, a), (eager, b) = runs
    assert lazy.preemptions > 0 and (mode == "recompute" or lazy.swaps_out > 0)
    assert lazy.log == eager.log
    for name in ("status", "first_token_ns", "end_ns", "preemptions", "prefix_hit_tokens", "step_end_ns"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert lazy.kv.all_hits == eager.kv.all_hits > 0   # own blocks re-hit after preemptions
