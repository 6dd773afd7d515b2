"""The block manager's free queue when prefix hits leave many stale entries behind (free
cached blocks taken from the middle, again and again, while the head moves slowly): its
buffer moves down and grows, and the queue stays what the naive model says."""

from __future__ import annotations

import pytest

from policies.kv_cache import KVCacheManager

from kv_naive import NaiveKV
from kv_ops import keys_of


@pytest.mark.parametrize("unhashed_first", [False, True])
def test_many_stale_entries_keep_the_queue(unhashed_first):
    kv = KVCacheManager(8, 4, enable_prefix_caching=True, free_unhashed_first=unhashed_first)
    ref = NaiveKV(8, 4, 0, unhashed_first=unhashed_first)
    keys = keys_of(list(range(8)), 4)
    for m in (kv, ref):
        m.allocate("a", 8)
        m.cache_blocks("a", 2, keys)
    kv.free("a")
    ref.free_req("a")
    for i in range(60):   # two hits on free cached blocks, one block from the head
        assert kv.computed_prefix(i, keys + [("x",)], 9, count=False) == ref.prefix(keys + [("x",)], 9) == 8
        assert kv.allocate(i, 9, keys, num_cached_tokens=8) == ref.allocate(i, 9, keys, 8) == 1
        assert kv.blocks_of(i) == ref.reqs[i]
        kv.free(i, 2)
        ref.free_req(i, 2)
        assert kv.free_block_ids() == ref.free
        kv.check()
    assert kv.allocate("b", 28) == ref.allocate("b", 28) == 7
    assert kv.blocks_of("b") == ref.reqs["b"]
    assert [kv.cached_key(b) for b in range(8)] == [None] * 8
    kv.check()
