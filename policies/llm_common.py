"""What the LLM policies share: per-request progress, prefix-block keys, step assembly.

Progress is kept in plain Python lists indexed by row: the policies read and write a
few scalars per request per step, which lists do faster than numpy arrays.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from schedsim.core.llm_policy import Step
from schedsim.core.policy import Reject, Requests

REJECT_TOO_LONG = "too_long"


class Progress:
    """Each request's prompt, target output, tokens computed (KV present) and generated."""

    def __init__(self, requests: Requests):
        self.prompt = requests.input_tokens.astype(np.int64).tolist()
        self.output = requests.output_tokens.astype(np.int64).tolist()
        n = len(requests)
        self.computed = [0] * n
        self.generated = [0] * n

    def known(self, row: int) -> int:
        """Tokens the request has: its prompt and what it generated so far."""
        return self.prompt[row] + self.generated[row]

    def remaining(self, row: int) -> int:
        return self.output[row] - self.generated[row]


def check_token_columns(requests: Requests, policy: str) -> None:
    """LLM policies need prompt and output lengths; say which column is missing."""
    from schedsim.errors import InputError

    if len(requests) and not (requests.output_tokens > 0).all():
        bad = int(np.flatnonzero(requests.output_tokens <= 0)[0])
        raise InputError(f"--policy {policy}: request row {bad} has output_tokens "
                         f"{int(requests.output_tokens[bad])}; LLM policies need input_tokens and "
                         f"output_tokens >= 1 for every request (an LLM trace: Azure LLM 2023, "
                         f"Mooncake, or a CSV with those columns)")
    if len(requests) and not (requests.input_tokens > 0).all():
        bad = int(np.flatnonzero(requests.input_tokens <= 0)[0])
        raise InputError(f"--policy {policy}: request row {bad} has input_tokens "
                         f"{int(requests.input_tokens[bad])}; LLM policies need prompts of >= 1 token")


KEY_SPAN = 1 << 40
"""Block indices per key family: the key of (family, block j) is ``key_base(family) + j``."""

_FAMILY_SPAN = 2 * KEY_SPAN
_MIX = 0x9E3779B97F4A7C15   # (2**64 / golden ratio, odd: a multiplicative hash)


def key_base(family: int) -> int:
    """The key of block 0 of a key family (a hash id, or ``-1 - row`` for a request's own
    blocks); block j's key is ``key_base(family) + j``, j < KEY_SPAN.

    Families lie ``2 * KEY_SPAN`` apart, each offset by a hash of the family below
    KEY_SPAN, so keys are equal exactly when their (family, j) pairs are, and the low bits
    of a key (which pick its slot in a dict) differ from family to family: keyed by
    ``family * KEY_SPAN + j``, the blocks at one index of all families would share them,
    and the block manager's cache dict would probe the same slots for each of them."""
    return family * _FAMILY_SPAN + (((family * _MIX) & 0xFFFFFFFFFFFFFFFF) >> 24)


class BlockKeys:
    """Prefix-cache keys of a request's full KV blocks, computed on demand.

    A block wholly inside a prompt that the trace describes by prefix-block hash ids
    (Mooncake: one id per 512 tokens, equal ids = equal prefix) is keyed by the id covering
    its last token and its index, so requests sharing a prefix share keys. Every other
    block (generated tokens, prompts without hash ids) gets a key unique to its request:
    it can only be found again by that request, after a preemption. A key is the pair
    (id or ``-1 - row``, index) packed into one int (:func:`key_base`): equal exactly when
    the pairs are, and cheaper to hash for the millions of blocks cached.

    ``shared``: how many leading blocks have hash-id keys (0 without hash ids); every
    later block's key is the request's own. Those ``shared`` keys are worked out at once
    on arrays (a Mooncake prompt has hundreds of blocks, looked up and registered one by
    one), and made Python ints when a slice first asks for keys (many prompts only have
    their first key looked up).
    """

    __slots__ = ("row", "block_size", "shared", "leading", "own")

    def __init__(self, requests: Requests, row: int, block_size: int):
        self.row, self.block_size = row, block_size
        self.leading, self.shared = _NO_KEYS, 0
        self.own = key_base(-1 - row)   # the key of the request's own block 0
        if requests.hash_ids is None:
            return
        lo, hi = requests.hash_offsets[row], requests.hash_offsets[row + 1]
        ids = np.asarray(requests.hash_ids[lo:hi], dtype=np.int64)
        per_id = int(requests.hash_block_tokens)
        # Block j has a hash-id key when (j + 1) * block_size <= min(prompt, ids * per_id).
        self.shared = shared = min(int(requests.input_tokens[row]), ids.shape[0] * per_id) // block_size
        if not shared:
            return
        if ids.min() >= 0 and ids.max() < (1 << 62) // _FAMILY_SPAN:
            # key_base on int64 (the hash's product wraps as the Python one is masked)
            mixed = (ids.astype(np.uint64) * np.uint64(_MIX)) >> np.uint64(24)
            base = ids * _FAMILY_SPAN + mixed.astype(np.int64)
        else:   # ids too large for int64 keys: Python ints
            base = np.array([key_base(h) for h in ids.tolist()], dtype=object)
        # The id covering block j's last token: index ((j + 1) * block_size - 1) // per_id,
        # that is j // (per_id / block_size) where a hash block is whole KV blocks.
        if per_id % block_size == 0:
            self.leading = np.repeat(base, per_id // block_size)[:shared]
        else:
            self.leading = base[((np.arange(shared) + 1) * block_size - 1) // per_id]
        self.leading += np.arange(shared)

    def __getitem__(self, j):
        if isinstance(j, slice):   # a list of keys: what the block manager reads
            start, stop, step = j.indices(KEY_SPAN)
            shared, own = self.shared, self.own
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            leading = self.leading
            if type(leading) is not list:   # Python ints once, at the first slice
                leading = self.leading = leading.tolist()
            return leading[start:stop] + list(range(own + max(start, shared), own + stop))
        if j < self.shared:
            return int(self.leading[j])
        return self.own + j

    def __len__(self) -> int:  # keys exist for any block index the request can reach
        return KEY_SPAN


_NO_KEYS = np.zeros(0, np.int64)


def shareable_blocks(requests: Requests, block_size: int) -> np.ndarray:
    """int64 per request: how many of its leading blocks (keyed by hash ids, as
    :attr:`BlockKeys.shared` counts them) another request may share: those up to its last
    hash id that another request has at the same place in its prompt. A later block's key
    (a hash id only this request has there) can be found again only by the request itself,
    as a generated block's can."""
    n = len(requests)
    if requests.hash_ids is None or not n:
        return np.zeros(n, np.int64)
    offsets = np.asarray(requests.hash_offsets, np.int64)
    ids = np.asarray(requests.hash_ids)
    counts = np.diff(offsets)
    owner = np.repeat(np.arange(n), counts)
    pos = np.arange(ids.shape[0]) - offsets[owner]
    order = np.lexsort((pos, ids))
    same = (ids[order][1:] == ids[order][:-1]) & (pos[order][1:] == pos[order][:-1])
    dup = np.zeros(ids.shape[0], bool)
    dup[1:] |= same
    dup[:-1] |= same
    common = np.empty(ids.shape[0], bool)
    common[order] = dup
    last = np.full(n, -1, np.int64)
    np.maximum.at(last, owner[common], pos[common])
    per_id = int(requests.hash_block_tokens)
    return np.minimum(hash_keyed_blocks(requests, block_size), (last + 1) * per_id // block_size)


def hash_keyed_blocks(requests: Requests, block_size: int) -> np.ndarray:
    """int64 per request: :attr:`BlockKeys.shared`, the leading blocks its hash ids key
    (those wholly inside both its prompt and the tokens its ids cover); zeros without hash ids."""
    n = len(requests)
    if requests.hash_ids is None or not n:
        return np.zeros(n, np.int64)
    counts = np.diff(np.asarray(requests.hash_offsets, np.int64))
    covered = counts * int(requests.hash_block_tokens)
    return np.minimum(requests.input_tokens.astype(np.int64), covered) // block_size


def make_step(rows: list, num_tokens: list, context: list, emits: list, **fields) -> Step:
    # (Positional, with dtype objects made once, and fromiter with the count: a simulated run
    # makes a step of a few rows tens of thousands of times, and argument handling is most
    # of its cost.)
    return Step(np.fromiter(rows, _INT64, len(rows)), np.fromiter(num_tokens, _INT32, len(num_tokens)),
                np.fromiter(context, _INT32, len(context)), np.fromiter(emits, _BOOL, len(emits)), **fields)


_INT64, _INT32, _BOOL = np.dtype(np.int64), np.dtype(np.int32), np.dtype(bool)


def rejects(rows: list) -> list[Reject]:
    return [Reject(np.array(rows, dtype=np.int64), REJECT_TOO_LONG)] if rows else []


class Waiting(deque):
    """Arrived requests not running, in FCFS order; preempted ones go back to the front."""


class PriorityWaiting:
    """Arrived requests not running, ordered by (priority, arrival, row): vLLM's priority
    queue (``PriorityRequestQueue``; a lower value is served first). A preempted request
    goes back to its place in that order, not to the front. The :class:`Waiting` interface
    the policies use: ``append``, ``appendleft``, ``popleft``, ``[0]``, ``len``."""

    __slots__ = ("_heap", "_priority", "_arrival")

    def __init__(self, requests: Requests):
        self._heap: list[tuple[int, int, int]] = []
        self._priority = requests.priority.astype(np.int64).tolist()
        self._arrival = requests.arrival_ns.tolist()

    def append(self, row: int) -> None:
        heapq.heappush(self._heap, (self._priority[row], self._arrival[row], row))

    appendleft = append

    def popleft(self) -> int:
        return heapq.heappop(self._heap)[2]

    def __getitem__(self, i: int) -> int:
        if i != 0:
            raise IndexError("PriorityWaiting: only the head ([0]) can be read")
        return self._heap[0][2]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self):
        return (row for _, _, row in sorted(self._heap))
