"""A seeded random walk of KV-cache operations, shared by the KV-cache and fast-path tests."""

from __future__ import annotations

import random

from policies.kv_cache import KVCacheManager

FAMILIES = [[f * 1000 + i for i in range(40)] for f in range(3)]   # shared prompt prefixes


def keys_of(tokens, block_size):
    """Chained block keys: key i names the whole prefix up to the end of block i."""
    return [tuple(tokens[:(i + 1) * block_size]) for i in range(len(tokens) // block_size)]


def run_ops(seed):
    rng = random.Random(seed)
    kv = KVCacheManager(32, 4, enable_prefix_caching=True, num_swap_blocks=8)
    toks, log = {}, []
    for step in range(400):
        op = rng.random()
        held = [r for r in toks if kv.holds(r)]
        if op < 0.4 or not toks:
            t = FAMILIES[rng.randrange(3)][:rng.randrange(30)] + [-step]
            keys = keys_of(t, 4)
            hit = kv.computed_prefix(step, keys, len(t))
            if kv.allocate(step, len(t), keys, hit) is not None:
                toks[step] = t
                kv.cache_blocks(step, len(t) // 4, keys)
        elif op < 0.7 and held:
            r = rng.choice(held)
            if kv.allocate(r, len(toks[r]) + 3) is not None:
                toks[r] += [-step] * 3
        elif op < 0.8 and held:
            r = rng.choice(held)
            if kv.can_swap_out(r):
                kv.swap_out(r)
        elif op < 0.9:
            swapped = [r for r in toks if kv.is_swapped(r)]
            if swapped and kv.can_swap_in(swapped[0]):
                kv.swap_in(swapped[0])
        else:
            r = rng.choice(list(toks))
            kv.free(r)
            del toks[r]
        log.append(tuple((r, tuple(kv.blocks_of(r))) for r in toks))
    kv.check()
    return kv.state(), log
