"""Prefix-cache keys of a request's blocks, and which of them other requests may share."""

from __future__ import annotations

import numpy as np
import pytest

from policies.llm_common import KEY_SPAN, BlockKeys, key_base, shareable_blocks
from llm_helpers import llm_requests


def key_of(requests, row: int, j: int, block_size: int) -> int:
    """Block j's key by its definition: the hash id covering its last token, if the prompt
    holds the whole block and an id covers it; the request's own key otherwise."""
    end = (j + 1) * block_size
    lo, hi = requests.hash_offsets[row], requests.hash_offsets[row + 1]
    ids = requests.hash_ids[lo:hi].tolist()
    if end <= int(requests.input_tokens[row]) and (end - 1) // requests.hash_block_tokens < len(ids):
        return key_base(ids[(end - 1) // requests.hash_block_tokens]) + j
    return key_base(-1 - row) + j


@pytest.mark.parametrize("offset", [0, 1 << 40])   # ids too large for int64 keys: Python ints
def test_block_keys_follow_their_definition_one_by_one_and_in_slices(offset):
    rng = np.random.default_rng(1)
    n = 30
    ids = [[int(x) + offset for x in rng.integers(0, 50, rng.integers(0, 6))] for _ in range(n)]
    req = llm_requests(np.arange(n, dtype=float), rng.integers(1, 300, n), rng.integers(1, 9, n),
                       hash_ids=ids, hash_block_tokens=32)
    for row in range(n):
        for bs in (1, 8, 16, 32, 64):
            keys = BlockKeys(req, row, bs)
            want = [key_of(req, row, j, bs) for j in range(60)]
            assert [keys[j] for j in range(60)] == want
            for a in range(0, 40, 7):
                for b in range(a, 60, 5):
                    assert keys[a:b] == want[a:b]
                assert keys[a:60:3] == want[a:60:3]


def test_keys_are_equal_exactly_when_family_and_index_are():
    families = [-(1 << 45), -100_000, -2, -1, 0, 1, 2, 3, 182_789, (1 << 21) - 1, 1 << 21, 1 << 50]
    places = [0, 1, 2, 31, 32, 1000, KEY_SPAN - 2, KEY_SPAN - 1]
    keys = {key_base(f) + j: (f, j) for f in families for j in places}
    assert len(keys) == len(families) * len(places)
    assert all((key < 0) == (f < 0) for key, (f, _) in keys.items())   # own keys never meet hash-id keys
    # Block j of every family in a slot of its own among 2**16: low bits vary with the family.
    assert len({(key_base(f) + 5) & 0xFFFF for f in range(-500, 500)}) > 900


def test_shareable_blocks_stop_at_the_last_hash_id_another_request_has_at_that_place():
    # 8-token hash blocks, 4-token KV blocks: two KV blocks per id.
    ids = [[1, 2, 3], [1, 2, 9], [7, 2], [5], []]
    prompt = [24, 24, 16, 8, 8]
    req = llm_requests(np.arange(5, dtype=float), prompt, [1] * 5, hash_ids=ids, hash_block_tokens=8)
    # Row 0 shares ids 1, 2 at places 0, 1 with row 1 (4 blocks), not id 3; row 2 shares
    # id 2 at place 1 with rows 0 and 1 (its 4 blocks); id 2 at place 1 makes row 2's id 7
    # block count too (the blocks up to its last common id); rows 3 and 4 share nothing.
    assert shareable_blocks(req, 4).tolist() == [4, 4, 4, 0, 0]
    assert [BlockKeys(req, r, 4).shared for r in range(5)] == [6, 6, 4, 2, 0]
    no_ids = llm_requests(np.arange(2, dtype=float), [8, 8], [1, 1])
    assert shareable_blocks(no_ids, 4).tolist() == [0, 0]
