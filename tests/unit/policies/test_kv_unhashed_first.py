"""KVCacheManager with ``free_unhashed_first`` (newer vLLM's free_blocks): random operation
sequences checked step by step against a naive list model of the rule: a freed block
that has no key and lies past the request's first ``num_hashed`` blocks goes to the head
of the free queue (the first freed first), the others reaching ref 0 to the tail."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.kv_cache import KVCacheManager

from kv_ops import FAMILIES, keys_of

BS = 4


class NaiveSplitKV:
    """Plain lists, linear scans."""

    def __init__(self, num_blocks, caching, swap):
        self.caching = caching
        self.free = list(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.key = [None] * num_blocks
        self.cache = {}   # key -> blocks with it, first cached first
        self.reqs, self.ncached, self.swapped, self.swap_free = {}, {}, {}, swap

    def lookup(self, k):
        return self.cache[k][0] if self.cache.get(k) else None

    def take(self, n):
        out = []
        for _ in range(n):
            b = self.free.pop(0)
            if self.key[b] is not None:
                self.cache[self.key[b]].remove(b)
                self.key[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def prefix(self, keys, n):
        hits = 0
        while self.caching and hits < min(len(keys), (n - 1) // BS) and self.lookup(keys[hits]) is not None:
            hits += 1
        return hits * BS

    def allocate(self, req, n, keys=(), cached=0):
        total = -(-n // BS)
        if req in self.reqs:
            need = max(total - len(self.reqs[req]), 0)
            if need > len(self.free):
                return None
            self.reqs[req] += self.take(need)
            return need
        hits = [self.lookup(k) for k in keys[:cached // BS]]
        need = total - len(hits)
        if need + sum(self.ref[b] == 0 for b in hits) > len(self.free):
            return None
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        self.reqs[req] = hits + self.take(need)
        self.ncached[req] = len(hits)
        return need

    def cache_blocks(self, req, nfull, keys):
        if not self.caching:
            return
        for i in range(self.ncached[req], nfull):
            b = self.reqs[req][i]
            self.key[b] = keys[i]
            self.cache.setdefault(keys[i], []).append(b)
        self.ncached[req] = max(self.ncached[req], nfull)

    def release(self, blocks, num_hashed):
        head, tail = [], []
        for i in reversed(range(len(blocks))):
            b = blocks[i]
            self.ref[b] -= 1
            if self.ref[b] == 0:
                hashed = self.caching and (i < num_hashed or self.key[b] is not None)
                (tail if hashed else head).append(b)
        self.free = head + self.free + tail

    def free_req(self, req, num_hashed):
        if req in self.swapped:
            self.swap_free += self.swapped.pop(req)
            return
        del self.ncached[req]
        self.release(self.reqs.pop(req), num_hashed)

    def swap_out(self, req):
        blocks = self.reqs.pop(req)
        del self.ncached[req]
        self.release(blocks, 0)
        self.swapped[req] = len(blocks)
        self.swap_free -= len(blocks)

    def swap_in(self, req):
        n = self.swapped.pop(req)
        self.swap_free += n
        self.reqs[req] = self.take(n)
        self.ncached[req] = 0


OPS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 40), st.integers(0, 12)),
               min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(2, 24), caching=st.booleans(), swap=st.integers(0, 12), ops=OPS)
def test_free_unhashed_first_follows_the_naive_model(num_blocks, caching, swap, ops):
    kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=caching, num_swap_blocks=swap,
                        free_unhashed_first=True)
    ref = NaiveSplitKV(num_blocks, caching, swap)
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
