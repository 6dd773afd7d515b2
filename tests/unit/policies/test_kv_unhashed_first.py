"""KVCacheManager with ``free_unhashed_first`` (newer vLLM's free_blocks): random operation
sequences checked step by step against a naive list model of the rule: a freed block
that has no key and lies past the request's first ``num_hashed`` blocks goes to the head
of the free queue (the first freed first), the others reaching ref 0 to the tail."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.kv_cache import KVCacheManager

from kv_naive import NaiveKV
from kv_ops import FAMILIES, keys_of

BS = 4


OPS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 40), st.integers(0, 12)),
               min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(2, 24), caching=st.booleans(), swap=st.integers(0, 12), ops=OPS)
def test_free_unhashed_first_follows_the_naive_model(num_blocks, caching, swap, ops):
    kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=caching, num_swap_blocks=swap,
                        free_unhashed_first=True)
    ref = NaiveKV(num_blocks, BS, swap, caching=caching, unhashed_first=True)
    tokens = {}
    for step, (op, a, b, c) in enumerate(ops):
        held = sorted(r for r in tokens if kv.holds(r))
        if op == 0 or not tokens:   # admit: a shared prefix of family a, then c tokens of its own
            toks = FAMILIES[a][:b] + [-(step * 100 + i) for i in range(c)]
            if not toks or -(-len(toks) // BS) > kv.usable_blocks:
                continue
            keys = keys_of(toks, BS)
            hit = kv.computed_prefix(step, keys, len(toks))
            assert hit == ref.prefix(keys, len(toks))
            got = kv.allocate(step, len(toks), keys, hit)
            assert got == ref.allocate(step, len(toks), keys, hit)
            if got is not None:
                tokens[step] = toks
                kv.cache_blocks(step, b // BS if b < len(toks) else len(toks) // BS, keys)
                ref.cache_blocks(step, b // BS if b < len(toks) else len(toks) // BS, keys)
        elif op == 1 and held:   # grow by c + 1 tokens (registered lazily: none now)
            r = held[b % len(held)]
            n = len(tokens[r]) + c + 1
            if -(-n // BS) <= kv.usable_blocks:
                got = kv.allocate(r, n)
                assert got == ref.allocate(r, n)
                if got is not None:
                    tokens[r] += [-(step * 100 + 50 + i) for i in range(c + 1)]
        elif op == 2:   # free, counting the first (b mod blocks + 2) blocks as hashed
            r = sorted(tokens)[b % len(tokens)]
            num_hashed = b % (len(kv.blocks_of(r)) + 2)
            kv.free(r, num_hashed)
            ref.free_req(r, num_hashed)
            del tokens[r]
        elif op == 3 and held:
            r = held[b % len(held)]
            if kv.can_swap_out(r):
                kv.swap_out(r)
                ref.swap_out(r)
        elif op == 4:
            swapped = sorted(r for r in tokens if kv.is_swapped(r))
            if swapped and kv.can_swap_in(swapped[0]):
                kv.swap_in(swapped[0])
                ref.swap_in(swapped[0])
        assert kv.free_block_ids() == ref.free
        assert {r: kv.blocks_of(r) for r in tokens if kv.holds(r)} == ref.reqs
        assert [kv.ref_count(x) for x in range(num_blocks)] == ref.ref
        assert [kv.cached_key(x) for x in range(num_blocks)] == ref.key
    kv.check()
