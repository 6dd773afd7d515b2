"""KVCacheManager: golden scenarios with exact block ids, a hypothesis state machine
checked against a naive list-based model of the same vLLM rules, and determinism."""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from policies.kv_cache import KVCacheError, KVCacheManager

from kv_naive import NaiveKV
from kv_ops import FAMILIES, keys_of, run_ops  # noqa: F401




# -- golden scenarios -----------------------------------------------------------------

def test_allocation_from_head_and_free_in_reverse():
    kv = KVCacheManager(8, 4)
    assert kv.usable_blocks == 7 and kv.free_block_ids() == [1, 2, 3, 4, 5, 6, 7]
    assert kv.allocate("a", 10) == 3
    assert kv.allocate("b", 4) == 1
    assert kv.blocks_of("a") == [1, 2, 3] and kv.blocks_of("b") == [4]
    assert kv.allocate("a", 12) == 0            # still fits in 3 blocks
    assert kv.allocate("a", 13) == 1            # crosses a block boundary
    assert kv.blocks_of("a") == [1, 2, 3, 5]
    kv.free("a")
    assert kv.free_block_ids() == [6, 7, 5, 3, 2, 1]   # tail blocks of "a" first
    assert kv.allocate("c", 9) == 3
    assert kv.blocks_of("c") == [6, 7, 5]
    assert (kv.num_free_blocks, kv.num_used_blocks) == (3, 4)
    kv.check()
    kv.free("b")
    kv.free("c")
    assert kv.num_free_blocks == kv.usable_blocks
    kv.check()


def test_cached_block_evicted_when_it_reaches_the_head():
    kv = KVCacheManager(6, 4, enable_prefix_caching=True)
    toks = list(range(8))
    keys = keys_of(toks, 4)
    kv.allocate("a", 8)
    kv.cache_blocks("a", 2, keys)
    kv.free("a")
    assert kv.free_block_ids() == [3, 4, 5, 2, 1]
    assert kv.cached_key(2) == keys[1]          # freed but still cached
    assert kv.computed_prefix("x", keys + [("z",)], 9, count=False) == 8
    assert kv.allocate("b", 12) == 3            # takes 3, 4, 5: uncached, nothing evicted
    assert kv.computed_prefix("x", keys, 9, count=False) == 8
    assert kv.allocate("c", 4) == 1             # takes block 2 from the head: evicts keys[1]
    assert kv.blocks_of("c") == [2] and kv.cached_key(2) is None
    assert kv.computed_prefix("x", keys, 9, count=False) == 4   # block 1 still hits
    kv.check()


def test_preempted_request_rehits_its_own_blocks():
    kv = KVCacheManager(10, 4, enable_prefix_caching=True)
    toks = list(range(10))
    keys = keys_of(toks, 4)                     # 2 full blocks
    assert kv.allocate("a", 10) == 3
    kv.cache_blocks("a", 2, keys)
    assert kv.blocks_of("a") == [1, 2, 3]
    kv.allocate("b", 4)                         # block 4
    kv.free("a")                                # preempted (recompute)
    assert kv.free_block_ids() == [5, 6, 7, 8, 9, 3, 2, 1]
    assert kv.computed_prefix("a", keys, 10) == 8
    assert kv.allocate("a", 10, keys, num_cached_tokens=8) == 1
    assert kv.blocks_of("a") == [1, 2, 5]
    assert kv.free_block_ids() == [6, 7, 8, 9, 3]
    assert kv.ref_count(1) == kv.ref_count(2) == 1
    # A second request with the same prefix shares the blocks.
    assert kv.computed_prefix("c", keys, 10) == 8
    assert kv.allocate("c", 10, keys, num_cached_tokens=8) == 1
    assert kv.blocks_of("c") == [1, 2, 6]
    assert kv.ref_count(1) == 2 and kv.num_used_blocks == 5
    assert (kv.hit_tokens, kv.queried_tokens) == (16, 20)
    kv.free("a")
    assert kv.ref_count(1) == 1 and kv.free_block_ids() == [7, 8, 9, 3, 5]
    kv.check()


def test_hit_never_covers_the_whole_prompt():
    kv = KVCacheManager(10, 4, enable_prefix_caching=True)
    toks = list(range(12))
    keys = keys_of(toks, 4)
    kv.allocate("a", 12)
    kv.cache_blocks("a", 3, keys)
    assert kv.computed_prefix("x", keys[:2], 8, count=False) == 4    # 8 - 1 = 7 tokens -> 1 block
    assert kv.computed_prefix("x", keys, 9, count=False) == 8
    assert kv.computed_prefix("x", keys, 12, count=False) == 8
    assert kv.computed_prefix("x", keys, 13, count=False) == 12
    assert kv.computed_prefix("x", keys, 1, count=False) == 0
    with pytest.raises(KVCacheError):           # a hit of the whole prompt is refused
        kv.allocate("x", 8, keys, num_cached_tokens=8)
    kv.check()


def test_prefix_caching_off_finds_nothing_and_counts_nothing():
    kv = KVCacheManager(10, 4)
    keys = keys_of(list(range(8)), 4)
    kv.allocate("a", 8)
    kv.cache_blocks("a", 2, keys)               # no-op
    assert kv.cached_key(1) is None
    assert kv.computed_prefix("x", keys, 9) == 0
    assert (kv.hit_tokens, kv.queried_tokens) == (0, 0)
    kv.check()


def test_watermark_refusal():
    kv = KVCacheManager(8, 4)
    assert kv.allocate("a", 24, watermark_blocks=2) is None      # 6 + 2 > 7
    assert not kv.holds("a")
    assert kv.allocate("a", 24, watermark_blocks=1) == 6         # 6 + 1 <= 7
    assert kv.allocate("a", 25, watermark_blocks=1) is None      # growth honours it too
    assert kv.allocate("a", 25) == 1
    kv.check()


def test_free_hit_blocks_consume_capacity_and_failure_changes_nothing():
    kv = KVCacheManager(8, 4, enable_prefix_caching=True)
    toks = list(range(100, 109))
    keys = keys_of(toks, 4)
    kv.allocate("a", 9)
    kv.cache_blocks("a", 2, keys)
    kv.free("a")                                # blocks 1, 2 cached and free
    kv.allocate("b", 16)                        # 4 blocks: 4, 5, 6, 7
    assert kv.num_free_blocks == 3 and kv.free_block_ids() == [3, 2, 1]
    assert kv.computed_prefix("c", keys, 20) == 8
    before = kv.state()
    # 3 new blocks + 2 free hit blocks > 3 free, although 3 new blocks alone would fit.
    assert kv.allocate("c", 20, keys, num_cached_tokens=8) is None
    assert kv.state() == before
    assert kv.allocate("c", 16, keys, num_cached_tokens=8) is None   # 2 + 2 > 3
    assert kv.state() == before
    assert kv.allocate("c", 12, keys, num_cached_tokens=8) == 1      # 1 + 2 <= 3
    assert kv.blocks_of("c") == [1, 2, 3] and kv.num_free_blocks == 0
    kv.check()


def test_duplicate_keys_keep_first_block_then_fall_back():
    kv = KVCacheManager(8, 4, enable_prefix_caching=True)
    keys = keys_of(list(range(5)), 4)
    kv.allocate("a", 5)                         # [1, 2]
    kv.allocate("b", 5)                         # [3, 4]: same prompt, computed in parallel
    kv.cache_blocks("a", 1, keys)
    kv.cache_blocks("b", 1, keys)
    assert kv.cached_key(1) == kv.cached_key(3) == keys[0]
    kv.check()
    kv.free("a")
    kv.free("b")
    assert kv.free_block_ids() == [5, 6, 7, 2, 1, 4, 3]
    assert kv.computed_prefix("c", keys, 5, count=False) == 4
    kv.allocate("c", 5, keys, num_cached_tokens=4)
    assert kv.blocks_of("c") == [1, 5]          # the first-cached block is the one found
    kv.free("c")
    kv.allocate("d", 28)                        # takes every free block: evicts 1 and 3
    assert kv.cached_key(1) is None and kv.cached_key(3) is None
    kv.free("d")
    kv.allocate("e", 9)
    kv.cache_blocks("e", 1, keys)
    kv.allocate("f", 9)
    kv.cache_blocks("f", 1, keys)
    first = kv.blocks_of("e")[0]
    second = kv.blocks_of("f")[0]
    kv.free("e")
    kv.free("f")
    # Evict only the first-cached block: the duplicate takes over.
    while kv.free_block_ids()[0] != first:
        kv.allocate(("fill", kv.free_block_ids()[0]), 1)
    kv.allocate("g", 1)
    assert kv.blocks_of("g") == [first] and kv.cached_key(first) is None
    assert kv.computed_prefix("h", keys, 5, count=False) == 4
    kv.allocate("h", 5, keys, num_cached_tokens=4)
    assert kv.blocks_of("h")[0] == second
    kv.check()


def test_duplicates_take_over_in_caching_order():
    kv = KVCacheManager(8, 4, enable_prefix_caching=True)
    keys = keys_of(list(range(5)), 4)
    for r in "abc":
        kv.allocate(r, 5)                       # a: [1, 2], b: [3, 4], c: [5, 6]
    for r in "acb":
        kv.cache_blocks(r, 1, keys)             # cached in the order 1, 5, 3
    for r in "abc":
        kv.free(r)
    assert kv.free_block_ids() == [7, 2, 1, 4, 3, 6, 5]
    kv.allocate("x", 12)                        # takes 7, 2, 1: evicts block 1
    kv.check()
    kv.allocate("y", 5, keys, num_cached_tokens=4)
    assert kv.blocks_of("y") == [5, 4]          # block 5 (cached second) takes over
    kv.check()


def test_swap_out_and_in_accounting():
    kv = KVCacheManager(8, 4, num_swap_blocks=4)
    kv.allocate("a", 12)                        # [1, 2, 3]
    kv.allocate("b", 8)                         # [4, 5]
    assert kv.can_swap_out("a") and kv.swap_out("a") == 3
    assert not kv.holds("a") and kv.is_swapped("a") and kv.blocks_of("a") == []
    assert kv.num_free_swap_blocks == 1 and kv.num_free_blocks == 5
    assert kv.free_block_ids() == [6, 7, 3, 2, 1]
    assert not kv.can_swap_out("b")             # 2 > 1 free swap block
    with pytest.raises(KVCacheError):
        kv.swap_out("b")
    with pytest.raises(KVCacheError):
        kv.allocate("a", 13)                    # must swap in first
    kv.allocate("c", 12)                        # [6, 7, 3]
    assert not kv.can_swap_in("a")              # 3 > 2 free
    with pytest.raises(KVCacheError):
        kv.swap_in("a")
    kv.free("c")
    assert kv.can_swap_in("a") and not kv.can_swap_in("a", watermark_blocks=3)
    assert kv.swap_in("a") == 3
    assert kv.blocks_of("a") == [2, 1, 3] and kv.num_free_swap_blocks == 4
    assert kv.allocate("a", 13) == 1
    kv.swap_out("a")
    kv.free("a")                                # freeing a swapped request releases swap space
    assert kv.num_free_swap_blocks == 4 and not kv.is_swapped("a")
    kv.free("b")
    assert kv.num_free_blocks == kv.usable_blocks
    kv.check()


def test_swap_out_keeps_gpu_copies_cached():
    kv = KVCacheManager(8, 4, enable_prefix_caching=True, num_swap_blocks=8)
    keys = keys_of(list(range(9)), 4)
    kv.allocate("a", 9)
    kv.cache_blocks("a", 2, keys)
    kv.swap_out("a")
    assert kv.computed_prefix("b", keys, 9, count=False) == 8
    kv.swap_in("a")                             # fresh, uncached blocks
    assert kv.blocks_of("a") == [4, 5, 6]
    kv.cache_blocks("a", 2, keys)               # re-registered as duplicates
    assert kv.cached_key(4) == keys[0]
    kv.check()


def test_broken_invariants_raise():
    kv = KVCacheManager(4, 4, enable_prefix_caching=True)
    with pytest.raises(KVCacheError):
        kv.free("nobody")
    kv.allocate("a", 4)
    kv.free("a")
    with pytest.raises(KVCacheError):
        kv.free("a")                            # twice
    with pytest.raises(KVCacheError):
        kv.allocate("big", 13)                  # 4 blocks > 3 usable: can never fit
    kv.allocate("a", 8)
    with pytest.raises(KVCacheError):
        kv.allocate("a", 16)                    # growing past the whole cache
    with pytest.raises(KVCacheError):
        kv.computed_prefix("a", [], 8)          # "a" is not new
    with pytest.raises(KVCacheError):
        kv.allocate("n", 9, [("k",), ("l",)], num_cached_tokens=4)   # stale hit
    with pytest.raises(KVCacheError):
        kv.cache_blocks("nobody", 1, [("k",)])
    with pytest.raises(ValueError):
        KVCacheManager(1, 16)
    kv.check()


def test_stats_counted_only_when_asked():
    kv = KVCacheManager(8, 4, enable_prefix_caching=True)
    keys = keys_of(list(range(9)), 4)
    kv.allocate("a", 9)
    kv.cache_blocks("a", 2, keys)
    for _ in range(3):                          # a policy retrying admission each step
        kv.computed_prefix("b", keys, 9, count=False)
    kv.computed_prefix("b", keys, 9)
    assert (kv.hit_tokens, kv.queried_tokens) == (8, 9)


# -- the state machine, against a naive model of the same rules (kv_naive) ------------

BS = 4


class KVMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(2, 24), swap=st.integers(0, 12), caching=st.booleans())
    def setup(self, num_blocks, swap, caching):
        self.kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=caching, num_swap_blocks=swap)
        self.ref = NaiveKV(num_blocks, BS, swap)
        self.caching = caching
        self.tokens = {}                        # request -> its tokens (held or swapped)
        self.next_id = 0

    def _keys(self, req):
        return keys_of(self.tokens[req], BS)

    @rule(family=st.integers(0, 2), shared=st.integers(0, 40), extra=st.integers(0, 12),
          watermark=st.integers(0, 2))
    def admit(self, family, shared, extra, watermark):
        req = self.next_id
        self.next_id += 1
        toks = FAMILIES[family][:shared] + [-(req * 100 + i) for i in range(extra)]
        if not toks:
            return
        keys = keys_of(toks, BS)
        hit = self.kv.computed_prefix(req, keys, len(toks))
        assert hit == (self.ref.prefix(keys, len(toks)) if self.caching else 0)
        if -(-len(toks) // BS) > self.kv.usable_blocks:
            with pytest.raises(KVCacheError):
                self.kv.allocate(req, len(toks), keys, hit, watermark)
            return
        before = self.kv.state()
        got = self.kv.allocate(req, len(toks), keys, hit, watermark)
        assert got == self.ref.allocate(req, len(toks), keys, hit, watermark)
        if got is None:
            assert self.kv.state() == before
            return
        self.tokens[req] = toks
        nfull = len(toks) // BS
        self.kv.cache_blocks(req, nfull, keys)
        if self.caching:
            self.ref.cache_blocks(req, nfull, keys)

    def _held(self):
        return sorted(r for r in self.tokens if self.kv.holds(r))

    @precondition(lambda self: any(self.kv.holds(r) for r in self.tokens))
    @rule(data=st.data(), n=st.integers(1, 9))
    def grow(self, data, n):
        req = data.draw(st.sampled_from(self._held()))
        toks = self.tokens[req]
        new_len = len(toks) + n
        if -(-new_len // BS) > self.kv.usable_blocks:
            return
        before = self.kv.state()
        got = self.kv.allocate(req, new_len)
        assert got == self.ref.allocate(req, new_len)
        if got is None:
            assert self.kv.state() == before
            return
        toks.extend(-(req * 100 + 50 + len(toks) + i) for i in range(n))
        nfull = new_len // BS
        self.kv.cache_blocks(req, nfull, self._keys(req))
        if self.caching:
            self.ref.cache_blocks(req, nfull, self._keys(req))

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def free(self, data):
        req = data.draw(st.sampled_from(sorted(self.tokens)))
        self.kv.free(req)
        self.ref.free_req(req)
        del self.tokens[req]
        with pytest.raises(KVCacheError):
            self.kv.free(req)

    @precondition(lambda self: any(self.kv.holds(r) for r in self.tokens))
    @rule(data=st.data())
    def swap_out(self, data):
        req = data.draw(st.sampled_from(self._held()))
        if self.kv.can_swap_out(req):
            assert self.kv.swap_out(req) == len(self.ref.reqs[req])
            self.ref.swap_out(req)
        else:
            assert len(self.ref.reqs[req]) > self.ref.swap_free

    @precondition(lambda self: any(self.kv.is_swapped(r) for r in self.tokens))
    @rule(data=st.data(), watermark=st.integers(0, 2))
    def swap_in(self, data, watermark):
        req = data.draw(st.sampled_from(sorted(r for r in self.tokens if self.kv.is_swapped(r))))
        if self.kv.can_swap_in(req, watermark):
            self.kv.swap_in(req)
            self.ref.swap_in(req)
            nfull = len(self.tokens[req]) // BS
            self.kv.cache_blocks(req, nfull, self._keys(req))
            if self.caching:
                self.ref.cache_blocks(req, nfull, self._keys(req))
        else:
            assert self.ref.swapped[req] + watermark > len(self.ref.free)

    @rule()
    def free_all(self):
        for req in sorted(self.tokens):
            self.kv.free(req)
            self.ref.free_req(req)
        self.tokens.clear()
        assert self.kv.num_free_blocks == self.kv.usable_blocks
        assert self.kv.num_free_swap_blocks == self.kv.num_swap_blocks

    @invariant()
    def consistent(self):
        if not hasattr(self, "kv"):
            return
        kv, ref = self.kv, self.ref
        kv.check()
        assert kv.num_used_blocks <= kv.usable_blocks
        assert kv.free_block_ids() == ref.free
        for req, toks in self.tokens.items():
            if kv.holds(req):
                assert kv.blocks_of(req) == ref.reqs[req]
                assert len(kv.blocks_of(req)) == -(-len(toks) // BS)
            else:
                assert kv.is_swapped(req)
        assert [kv.ref_count(b) for b in range(kv.num_blocks)] == ref.ref
        assert [kv.cached_key(b) for b in range(kv.num_blocks)] == ref.key
        assert kv.num_free_swap_blocks == ref.swap_free

    def teardown(self):
        if hasattr(self, "kv"):
            self.free_all()
            self.kv.check()


KVMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None,
                                       derandomize=True, suppress_health_check=[HealthCheck.too_slow])
TestKVMachine = KVMachine.TestCase


# -- determinism ----------------------------------------------------------------------



def test_same_operations_same_block_ids():
    a, b = run_ops(7), run_ops(7)
    assert a == b
    assert run_ops(8)[0] != a[0]
