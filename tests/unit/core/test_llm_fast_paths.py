"""The simulator's fast paths give exactly what the plain ones do.

A batched allocation equals one-block allocations in turn; the free queue's list with
stale entries behaves like the reference whatever its compaction point; step
summaries on Python lists equal those on arrays.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from policies.kv_cache import KVCacheManager
from schedsim.cost.step_model import _summary_of_arrays, _summary_of_lists
from schedsim.core.llm_policy import int_max
from kv_ops import run_ops


def busy_manager(seed: int, caching: bool, cls=KVCacheManager):
    """A manager after random traffic: allocations, prefix hits, frees (stale entries)."""
    rng = random.Random(seed)
    kv = cls(64, 4, enable_prefix_caching=caching)
    held: dict[int, int] = {}
    for step in range(200):
        if rng.random() < 0.6 or not held:
            tokens = rng.randrange(1, 20)
            keys = [(rng.randrange(3) if i < 2 else -step, i) for i in range(tokens // 4 + 1)]
            hit = kv.computed_prefix(step, keys, tokens, count=False)
            if kv.allocate(step, tokens, keys, hit) is not None:
                kv.cache_blocks(step, tokens // 4, keys)
                held[step] = tokens
        else:
            r = rng.choice(sorted(held))
            kv.free(r)
            del held[r]
    return kv, held


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_round_robin_allocation_equals_one_block_at_a_time(seed, caching):
    a, held = busy_manager(seed, caching)
    b, _ = busy_manager(seed, caching)
    reqs = sorted(held)[:5]
    if not reqs:
        return
    total = min(a.num_free_blocks, 3 * len(reqs) + 2)
    a.allocate_round_robin(reqs, total)
    for i in range(total):
        r = reqs[i % len(reqs)]
        assert b.allocate(r, (len(b.blocks_of(r)) + 1) * b.block_size) == 1
    a.check()
    assert a.state() == b.state()


def test_round_robin_allocation_without_room_changes_nothing():
    kv, held = busy_manager(1, True)
    before = kv.state()
    with pytest.raises(AssertionError):
        kv.allocate_round_robin(sorted(held)[:1], kv.num_free_blocks + 1)
    assert kv.state() == before


class CompactEarly(KVCacheManager):
    COMPACT_AT = 0


@pytest.mark.parametrize("seed", range(6))
def test_free_queue_compaction_changes_nothing(seed, monkeypatch):
    expected = run_ops(seed)
    monkeypatch.setattr("kv_ops.KVCacheManager", CompactEarly)
    assert run_ops(seed) == expected
    for caching in (False, True):
        a, _ = busy_manager(seed, caching)
        b, _ = busy_manager(seed, caching, CompactEarly)
        b.check()
        assert a.state() == b.state()


def test_step_summaries_on_lists_equal_those_on_arrays():
    rng = np.random.default_rng(0)
    for n in list(range(1, 60)) * 5:
        tokens = np.where(rng.random(n) < 0.7, 1, rng.integers(2, 600, n)).astype(np.int32)
        context = rng.integers(0, 5000, n).astype(np.int32)
        assert _summary_of_lists(tokens.tolist(), context.tolist()) == _summary_of_arrays(tokens, context)
        assert int_max(context) == int(context.max())
