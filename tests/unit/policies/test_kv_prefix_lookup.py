"""KVCacheManager.allocate takes a new request's hit blocks as the cache has them when it
runs, whatever changed since computed_prefix counted them."""

from __future__ import annotations

import pytest

from policies.kv_cache import KVCacheError, KVCacheManager

from kv_ops import keys_of


def cached_manager():
    """Blocks 1-3 free and cached under the keys of 12 tokens; 4-7 free, uncached."""
    kv = KVCacheManager(8, 4, enable_prefix_caching=True)
    keys = keys_of(list(range(12)), 4)
    kv.allocate("a", 12)
    kv.cache_blocks("a", 3, keys)
    kv.free("a")
    return kv, keys


def test_allocate_after_a_lookup_equals_allocate_alone():
    looked, keys = cached_manager()
    alone, _ = cached_manager()
    assert looked.computed_prefix("b", keys, 13, count=False) == 12
    assert (looked.allocate("b", 13, keys, num_cached_tokens=12)
            == alone.allocate("b", 13, keys, num_cached_tokens=12) == 1)
    assert looked.blocks_of("b")[:3] == [1, 2, 3]
    looked.check()
    assert looked.state() == alone.state()


def test_a_block_evicted_after_the_lookup_is_not_taken():
    kv, keys = cached_manager()
    assert kv.computed_prefix("b", keys, 13, count=False) == 12
    kv.allocate("c", 20)   # takes 4-7 and then the head, block 3: its key is evicted
    assert kv.cached_key(3) is None
    with pytest.raises(KVCacheError, match="no longer cached"):
        kv.allocate("b", 13, keys, num_cached_tokens=12)
    kv.free("c")
    assert kv.computed_prefix("b", keys, 13, count=False) == 8
    assert kv.allocate("b", 9, keys, num_cached_tokens=8) == 1
    assert kv.blocks_of("b") == [1, 2, 3]   # blocks 1, 2 hit; 3, at the head past their entries, is new
    kv.check()


def test_a_key_registered_after_the_lookup_keeps_the_block_found_first():
    kv, keys = cached_manager()
    assert kv.computed_prefix("b", keys, 13, count=False) == 12
    kv.allocate("d", 4)            # block 4
    kv.cache_blocks("d", 1, keys)  # the same key as block 1: block 4 becomes its successor
    assert kv.allocate("b", 13, keys, num_cached_tokens=12) == 1
    assert kv.blocks_of("b")[:3] == [1, 2, 3]
    kv.check()
