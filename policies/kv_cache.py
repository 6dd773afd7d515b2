"""KV-cache block manager: vLLM v1 paged blocks and prefix caching, plus vLLM v0 swap.

Deterministic, no simpy and no torch: the ``paged-kv`` and ``continuous`` policies call it
once or more per simulated step, and the live engine reads block ids from it. Work per call
is proportional to the blocks it touches, done in numpy and in C-level loops over Python's
containers rather than Python statements per block (a simulated run moves millions).

Model (vLLM v1: ``vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``,
``single_type_kv_cache_manager.py``, ``kv_cache_utils.py``, in the versions whose
``BlockPool.free_blocks`` appends every freed block to the tail):

- ``num_blocks`` GPU blocks of ``block_size`` tokens. Block 0 is the null block and is
  never handed out, so ``usable_blocks == num_blocks - 1``.
- Every other block is either *free* (ref count 0, in an LRU free queue, possibly still
  cached) or *held* (ref count = the number of requests holding it).
- Allocation pops from the head of the free queue; a popped block that is cached loses
  its key at that moment (eviction).
- :meth:`free` decrements ref counts and appends the blocks that reach 0 to the tail in
  reverse order of the request's block list, so a request's tail blocks are evicted
  first. Freed cached blocks stay findable until popped.
- Prefix caching stores FULL blocks under caller-supplied keys (the caller chains them,
  e.g. hash(parent key, block tokens) or Mooncake ``hash_ids``); this class only maps
  key -> block. A lookup walks the key list to the first miss, and never covers the
  whole prompt: at most ``num_tokens - 1`` tokens, rounded down to whole blocks.
- Like vLLM, a key may be held by several blocks (two requests with the same prefix
  both computed it before either cached it). Lookups return the block that was cached
  first; when it is evicted the next one takes over (``BlockHashToBlockMap``).
- When checking whether an allocation fits, hit blocks that are currently free count as
  consumed capacity, because touching them takes them out of the free queue
  (``num_evictable_computed_blocks`` in vLLM).

Swap (vLLM v0, ``vllm/core/block_manager.py``): :meth:`swap_out` moves a request's GPU
blocks to host swap space: its GPU blocks are released exactly as :meth:`free` does
(their cached keys are KEPT, since the GPU copy stays valid until the block is reused)
and as many swap blocks are reserved; :meth:`swap_in` takes that many fresh GPU blocks
from the free-queue head (uncached: call :meth:`cache_blocks` again to re-register
them) and releases the swap blocks. Shared prefix blocks are copied per request, as v0
without prefix caching does.

Expected failure is a value: :meth:`allocate` returns ``None`` and changes nothing.
A broken invariant (unknown request, double free, a request larger than the whole
cache, swap without room after ``can_swap_*`` said no) raises :class:`KVCacheError`.

Public interface of :class:`KVCacheManager`:

- ``usable_blocks`` / ``block_size`` / ``num_swap_blocks``: sizes (attributes).
- ``num_free_blocks``: blocks allocatable now (free-queue length, cached ones included).
- ``num_used_blocks``: distinct blocks held by requests (ref > 0), null block excluded.
- ``num_free_swap_blocks``: swap blocks not reserved.
- ``hit_tokens`` / ``queried_tokens``: prefix-cache statistics, tokens found / prompt
  tokens looked up, added to by :meth:`computed_prefix` only when ``count=True`` so a
  policy that retries admission every step counts each admission attempt once.
- ``blocks_needed(num_tokens)``: ceil(num_tokens / block_size).
- ``computed_prefix(req, keys, num_tokens, count=True)``: cached tokens for a new request.
- ``allocate(req, num_tokens, keys=None, num_cached_tokens=0, watermark_blocks=0)``:
  grow ``req`` to cover ``num_tokens``; new blocks taken, or ``None`` if it does not fit.
- ``allocate_round_robin(reqs, num_blocks)``: one block each to ``reqs`` in turn, cycling
  (the blocks of a run of repeated decode steps, in one call).
- ``allocate_each(reqs, num_tokens)`` / ``fits_each(reqs, num_tokens)``: grow several
  requests in turn, all or none (the running requests of one step, in one call).
- ``cache_blocks(req, num_full_blocks, keys)``: register the request's full blocks.
- ``free(req)``: release a request's GPU blocks (or its swap blocks if swapped out).
- ``blocks_of(req)`` / ``holds(req)`` / ``is_swapped(req)``: what a request has.
- ``can_swap_out(req)`` / ``swap_out(req)`` / ``can_swap_in(req, watermark_blocks=0)`` /
  ``swap_in(req)``: v0 swap.
- ``free_block_ids()``: the free queue, head (next to be allocated) first.
- ``ref_count(block)`` / ``cached_key(block)``: per-block state, for tests and tools.
- ``state()``: a hashable snapshot of everything, for tests (determinism, no side effects).
- ``check()``: full invariant check, O(blocks); for tests and debugging only.

With ``free_unhashed_first`` (newer vLLM: ``BlockPool.free_blocks`` splits what it frees
into ``prepend_n`` and ``append_n``), a freed block that has no hash (a request's partial
last block, or any block while prefix caching is off) goes to the HEAD of the free queue
and is reused first (LIFO); hashed blocks still go to the tail. :meth:`free` takes how many
of the request's leading blocks count as hashed (a caller that registers keys lazily knows
more full blocks than it registered).

Not modelled: hybrid/sliding-window groups; v0's prefix-caching CPU allocator.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Hashable, Sequence
from itertools import takewhile

import numpy as np

__all__ = ["KVCacheError", "KVCacheManager"]


class KVCacheError(AssertionError):
    """A broken invariant: a caller bug (e.g. freeing an unknown request) or a bug here."""


class KVCacheManager:
    """GPU KV blocks with an LRU free queue and optional prefix caching; host swap space.

    Requests are named by any hashable id (schedsim uses integer trace rows).
    """

    COMPACT_AT = 1 << 20
    """Consumed free-queue entries kept before a take moves the queue down (amortised O(1));
    a free moves it down anyway when it finds no room at the tail of its buffer."""

    __slots__ = (
        "num_blocks", "block_size", "usable_blocks", "enable_prefix_caching",
        "num_swap_blocks", "free_unhashed_first", "_front", "_queue", "_index", "_head", "_tail", "_pos",
        "_nstale", "_ref", "_nshared", "_key", "_keyed", "_cache", "_dups", "_req", "_ncached",
        "_swapped", "_free_swap", "hit_tokens", "queried_tokens",
    )

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False,
                 num_swap_blocks: int = 0, free_unhashed_first: bool = False):
        if int(num_blocks) < 2:
            raise ValueError(f"num_blocks: {num_blocks!r} is not valid; expected an integer >= 2 "
                             "(block 0 is reserved)")
        if int(block_size) < 1:
            raise ValueError(f"block_size: {block_size!r} is not valid; expected an integer >= 1")
        if int(num_swap_blocks) < 0:
            raise ValueError(f"num_swap_blocks: {num_swap_blocks!r} is not valid; expected an integer >= 0")
        self.num_blocks = n = int(num_blocks)
        self.block_size = int(block_size)
        self.usable_blocks = n - 1
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.num_swap_blocks = int(num_swap_blocks)
        self.free_unhashed_first = bool(free_unhashed_first)
        # Blocks put at the head of the free queue (free_unhashed_first), as a stack: its
        # last entry is the head. They have no key, so no prefix hit takes one out early.
        self._front: list[int] = []
        # Free queue, head first: the live entries of _queue[_head:_tail] (an int64 buffer,
        # moved down and grown as needed). Blocks are taken from the head as one slice and
        # freed onto the tail as one copy. _pos[b] is the index of block b's live entry; an
        # entry i whose block has _pos != i is stale (a free block taken from the middle by
        # a prefix hit leaves its entry behind) and is skipped when the head reaches it: a
        # block re-enters the queue only at the tail, so its stale entries come before its
        # live one. _nstale counts the stale entries between head and tail.
        self._queue = np.zeros(2 * n, np.int64)
        self._queue[:n - 1] = np.arange(1, n)
        self._index = np.arange(2 * n, dtype=np.int64)   # 0, 1, ...: a slice is a run of entry indices
        self._head, self._tail = 0, n - 1
        self._pos = np.arange(-1, n - 1, dtype=np.int64)
        self._nstale = 0
        # Ref counts are kept only for blocks with a key (only those can be shared: a prefix
        # hit finds a block by its key), so only with prefix caching; a block without one is
        # held by one request at most (_refs counts those from the block tables).
        self._ref = np.zeros(n, np.int64)
        self._nshared = 0   # blocks held by more than one request (prefix hits)
        self._key = np.full(n, None, dtype=object)   # block -> its cache key (any hashable)
        self._keyed = np.zeros(n, bool)              # block -> whether it has one
        self._cache: dict[Hashable, int] = {}          # key -> block lookups return
        self._dups: dict[Hashable, list[int]] = {}     # key -> later blocks with that key, oldest first
        self._req: dict[Hashable, array] = {}          # request -> its GPU blocks, in token order (int64)
        self._ncached: dict[Hashable, int] = {}        # request -> leading blocks already cached
        self._swapped: dict[Hashable, int] = {}        # request -> swap blocks it occupies
        self._free_swap = self.num_swap_blocks
        self.hit_tokens = 0
        self.queried_tokens = 0

    # -- sizes -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self._tail - self._head - self._nstale + len(self._front)

    @property
    def num_used_blocks(self) -> int:
        return self.usable_blocks - self.num_free_blocks

    @property
    def num_free_swap_blocks(self) -> int:
        return self._free_swap

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- requests ----------------------------------------------------------------------

    def holds(self, req: Hashable) -> bool:
        """True while ``req`` holds GPU blocks (allocated and neither freed nor swapped out)."""
        return req in self._req

    def is_swapped(self, req: Hashable) -> bool:
        return req in self._swapped

    def blocks_of(self, req: Hashable) -> list[int]:
        """Block ids of ``req`` in token order (a copy); ``[]`` if it holds none."""
        blocks = self._req.get(req)
        return blocks.tolist() if blocks is not None else []

    # -- prefix cache ------------------------------------------------------------------

    def computed_prefix(self, req: Hashable, keys: Sequence[Hashable], num_tokens: int,
                        count: bool = True) -> int:
        """Tokens of a new request's ``num_tokens``-token prompt already in the cache.

        ``keys[i]`` is the key of the prompt's block i (full blocks only). The result is
        hit_blocks * block_size with hit_blocks * block_size <= num_tokens - 1. Read-only;
        with ``count`` the lookup is added to ``hit_tokens`` / ``queried_tokens``.
        """
        if req in self._req or req in self._swapped:
            raise KVCacheError(f"computed_prefix: request {req!r} already has blocks")
        if not self.enable_prefix_caching:
            return 0
        limit = min(len(keys), (num_tokens - 1) // self.block_size)
        cache = self._cache
        hits = 0
        if limit and keys[0] in cache:   # (most lookups miss at once: no list of keys then)
            # Keys a slice at a time, growing: a lookup repeated every step while its request
            # waits reads what it hits, not its whole prompt's keys.
            size = 16
            while True:
                end = min(limit, hits + size)
                hits += len(list(takewhile(cache.__contains__, keys[hits:end])))
                if hits < end or hits == limit:
                    break
                size *= 4
        tokens = hits * self.block_size
        if count:
            self.hit_tokens += tokens
            self.queried_tokens += num_tokens
        return tokens

    def cache_blocks(self, req: Hashable, num_full_blocks: int, keys: Sequence[Hashable]) -> None:
        """Register ``req``'s first ``num_full_blocks`` blocks under ``keys[i]``.

        Blocks already registered are skipped; a key another block already has stays
        with that block for lookups (this one becomes its successor). No-op when prefix
        caching is off.
        """
        if not self.enable_prefix_caching:
            return
        blocks = self._req.get(req)
        if blocks is None:
            raise KVCacheError(f"cache_blocks: request {req!r} holds no blocks")
        start = self._ncached[req]
        if num_full_blocks <= start:
            return
        if num_full_blocks > len(blocks) or num_full_blocks > len(keys):
            raise KVCacheError(f"cache_blocks: request {req!r} has {len(blocks)} blocks and "
                               f"{len(keys)} keys, cannot cache {num_full_blocks}")
        # A request's blocks past its leading cached ones have no key: each was taken from
        # the free queue (where a cached block loses its key) and only this call keys them.
        new_blocks, new_keys = blocks[start:num_full_blocks], keys[start:num_full_blocks]
        # Each key to its block unless a block has it already (or it is given twice): the
        # map then has fewer new keys than blocks, and a block whose key maps to another
        # becomes that one's successor.
        cache = self._cache
        before = len(cache)
        deque(map(cache.setdefault, new_keys, new_blocks), 0)
        nb = np.frombuffer(new_blocks, np.int64)
        self._key[nb] = np.fromiter(new_keys, object, nb.shape[0])
        self._keyed[nb] = True
        self._ref[nb] = 1
        if len(cache) - before != nb.shape[0]:
            dups = self._dups
            for b, k in zip(new_blocks, new_keys):
                if cache[k] != b:
                    dups.setdefault(k, []).append(b)
        self._ncached[req] = num_full_blocks

    def _uncache(self, b: int, k: Hashable) -> None:
        """Drop block ``b``'s key ``k`` (its key entry is already cleared): the next block
        with the key, if any, takes over lookups."""
        if self._cache[k] == b:
            later = self._dups.get(k)
            if later:
                self._cache[k] = later.pop(0)
                if not later:
                    del self._dups[k]
            else:
                del self._cache[k]
        else:
            later = self._dups[k]
            later.remove(b)
            if not later:
                del self._dups[k]

    # -- allocation --------------------------------------------------------------------

    def _take(self, n: int, out: array) -> None:
        """Pop ``n`` blocks from the free-queue head onto ``out`` (caller checked room)."""
        if n <= 0:
            return
        front = self._front
        if front:   # the head-of-queue stack first, its last entry first
            k = min(n, len(front))
            taken = front[-k:]
            taken.reverse()
            del front[-k:]
            out.extend(taken)   # blocks without a key: nothing to evict
            n -= k
            if not n:
                return
        head = self._head
        if head + n > self._tail:
            raise KVCacheError(f"free queue: {n} blocks asked, fewer free")
        if n == 1:   # (most takes: a decode step's new block) on scalars
            b = int(self._queue[head])
            if not self._nstale or self._pos[b] == head:
                self._head = head + 1
                if self._keyed[b]:
                    self._evict_one(b)
                out.append(b)
                if self._head > self.COMPACT_AT and self._head * 2 > self._tail:
                    self._move_down()
                return
        taken = self._queue[head:head + n]
        if self._nstale and not (self._pos[taken] == self._index[head:head + n]).all():
            taken = self._take_past_stale(n)
        else:
            self._head = head + n
        if self._cache:   # a popped cached block is evicted (none is while nothing is cached)
            keyed = taken[self._keyed[taken]]
            if keyed.shape[0]:
                self._evict(keyed)
        out.frombytes(taken.tobytes())
        if self._head > self.COMPACT_AT and self._head * 2 > self._tail:   # drop the consumed entries
            self._move_down()

    def _take_past_stale(self, n: int) -> np.ndarray:
        """:meth:`_take`'s slow path: the next ``n`` live entries, dropping stale ones passed."""
        queue, pos, i = self._queue, self._pos, self._head
        parts = []
        while n:
            if i + n > self._tail:
                raise KVCacheError("free queue: fewer live entries than counted")
            part = queue[i:i + n]
            part = part[pos[part] == self._index[i:i + n]]
            parts.append(part)
            self._nstale -= n - part.shape[0]
            i += n
            n -= part.shape[0]
        self._head = i
        return np.concatenate(parts)

    def _evict(self, blocks: np.ndarray) -> None:
        """Drop the keys of cached ``blocks`` just taken from the free queue, in order."""
        keys = self._key[blocks].tolist()
        self._key[blocks] = None
        self._keyed[blocks] = False
        if self._dups and not self._dups.keys().isdisjoint(keys):
            for b, k in zip(blocks.tolist(), keys):
                self._uncache(b, k)
        else:   # one block per key: k's is b
            deque(map(self._cache.__delitem__, keys), 0)

    def _evict_one(self, b: int) -> None:
        """:meth:`_evict` of one block."""
        k = self._key[b]
        self._key[b] = None
        self._keyed[b] = False
        if k in self._dups:
            self._uncache(b, k)
        else:
            del self._cache[k]

    def _append(self, blocks: np.ndarray) -> None:
        """Put ``blocks`` (distinct, not in the queue) at the free-queue tail, in order."""
        m = blocks.shape[0]
        tail = self._tail
        if tail + m > self._queue.shape[0]:
            self._move_down()
            tail = self._tail
            if tail + m > self._queue.shape[0]:   # stale entries fill it: grow
                grown = np.zeros(2 * (tail + m), np.int64)
                grown[:tail] = self._queue[:tail]
                self._queue, self._index = grown, np.arange(grown.shape[0], dtype=np.int64)
        queue = self._queue
        queue[tail:tail + m] = blocks
        # Indexed by the queue's own (contiguous) copy: a free passes its blocks reversed, a
        # negative-stride index that makes the scatter about twice as slow.
        self._pos[queue[tail:tail + m]] = self._index[tail:tail + m]
        self._tail = tail + m

    def _move_down(self) -> None:
        """Move the queue's entries from the head on to the start of its buffer."""
        head, tail = self._head, self._tail
        if not head:
            return
        queue, pos = self._queue, self._pos
        entries = queue[head:tail].copy()
        live = entries[pos[entries] == self._index[head:tail]]
        pos[live] -= head
        queue[:tail - head] = entries
        self._head, self._tail = 0, tail - head

    def allocate(self, req: Hashable, num_tokens: int, keys: Sequence[Hashable] | None = None,
                 num_cached_tokens: int = 0, watermark_blocks: int = 0,
                 full_tokens: int = 0) -> int | None:
        """Make ``req`` hold blocks for ``num_tokens`` tokens in all; return the new blocks taken.

        A request with no blocks yet and ``num_cached_tokens`` > 0 (from
        :meth:`computed_prefix` this step) first takes the hit blocks of
        ``keys[:num_cached_tokens // block_size]``. Returns ``None``, changing nothing, if
        the new blocks + the free hit blocks + ``watermark_blocks`` exceed the free blocks.
        Never shrinks a request.

        ``full_tokens`` (a new request only): fail unless blocks for that many tokens would
        fit, though only ``num_tokens`` are allocated (vLLM's ``full_sequence_must_fit``:
        a request is admitted when its whole known sequence fits, not just its first chunk).
        """
        blocks = self._req.get(req)
        if blocks is not None:
            # Running request: the hot path (a decode step needs a block 1 time in block_size).
            if num_cached_tokens:
                raise KVCacheError(f"allocate: request {req!r} already holds blocks; "
                                   "prefix hits apply only to a new request")
            need = -(-num_tokens // self.block_size) - len(blocks)
            if need <= 0:
                return 0
            if need + watermark_blocks > self.num_free_blocks:
                if need + len(blocks) > self.usable_blocks:
                    raise KVCacheError(f"allocate: request {req!r} needs {need + len(blocks)} "
                                       f"blocks; only {self.usable_blocks} exist")
                return None
            self._take(need, blocks)
            return need

        if req in self._swapped:
            raise KVCacheError(f"allocate: request {req!r} is swapped out; swap it in first")
        if num_tokens < 1:
            raise KVCacheError(f"allocate: num_tokens {num_tokens!r} for new request {req!r}; expected >= 1")
        total = -(-num_tokens // self.block_size)
        if total > self.usable_blocks:
            raise KVCacheError(f"allocate: request {req!r} needs {total} blocks; "
                               f"only {self.usable_blocks} exist")
        hit_blocks: list[int] = []
        evictable = 0
        if num_cached_tokens:
            nhit, rem = divmod(num_cached_tokens, self.block_size)
            if (not self.enable_prefix_caching or rem or num_cached_tokens >= num_tokens
                    or keys is None or nhit > len(keys)):
                raise KVCacheError(f"allocate: num_cached_tokens {num_cached_tokens!r} for request "
                                   f"{req!r} is not a prefix hit of its {num_tokens} tokens")
            hit_blocks = list(map(self._cache.get, keys[:nhit]))
            if None in hit_blocks:
                raise KVCacheError(f"allocate: key {hit_blocks.index(None)} of request {req!r} is no "
                                   "longer cached; call computed_prefix in the same step")
            hit = np.array(hit_blocks, np.int64)
            refs = self._ref[hit]
            free = refs == 0
            evictable = int(np.count_nonzero(free))
        need = total - len(hit_blocks)
        whole = max(total, -(-full_tokens // self.block_size))
        if whole > self.usable_blocks:
            return None   # the whole sequence can never fit; the caller stops it at the limit
        if whole - len(hit_blocks) + evictable + watermark_blocks > self.num_free_blocks:
            return None
        blocks = array("q", hit_blocks)
        if hit_blocks:   # (distinct blocks: one key each)
            if evictable:   # free blocks taken from the middle of the queue: stale entries
                self._pos[hit[free]] = -1
                self._nstale += evictable
            self._nshared += int(np.count_nonzero(refs == 1))
            self._ref[hit] = refs + 1
        self._take(need, blocks)
        self._req[req] = blocks
        self._ncached[req] = total - need
        return need

    def allocate_round_robin(self, reqs: Sequence[Hashable], num_blocks: int) -> None:
        """Give one more block to each of ``reqs`` in turn, cycling, ``num_blocks`` in all.

        The same as ``num_blocks`` one-block :meth:`allocate` calls for ``reqs[0], reqs[1],
        ..., reqs[-1], reqs[0], ...`` (blocks leave the head in that order), in one call:
        how a run of repeated decode steps grows its requests. Each must hold blocks;
        raises :class:`KVCacheError`, changing nothing, if fewer than ``num_blocks`` are free.
        """
        tables = []
        for req in reqs:
            blocks = self._req.get(req)
            if blocks is None:
                raise KVCacheError(f"allocate_round_robin: request {req!r} holds no blocks")
            tables.append(blocks)
        if num_blocks > self.num_free_blocks:
            raise KVCacheError(f"allocate_round_robin: {num_blocks} blocks asked, "
                               f"{self.num_free_blocks} free")
        k = len(tables)
        if num_blocks <= k:   # (mostly: a short run) one block each to the first ones
            for blocks in tables[:num_blocks]:
                self._take(1, blocks)
            return
        taken = array("q")
        self._take(num_blocks, taken)
        for i, blocks in enumerate(tables):
            blocks += taken[i::k]

    def allocate_each(self, reqs: Sequence[Hashable], num_tokens: Sequence[int]) -> bool:
        """Grow each of ``reqs`` (each holding blocks) to ``num_tokens[i]`` tokens, in turn:
        the same as ``allocate(reqs[i], num_tokens[i])`` for each ``i`` when all of them fit,
        in one take from the free queue. Returns False, changing nothing, when they do not
        all fit (the caller then decides one by one, preempting where one fails)."""
        grown, total = self._growth(reqs, num_tokens)
        if total > self.num_free_blocks:
            return False
        if total:
            taken = array("q")
            self._take(total, taken)
            at = 0
            for blocks, need in grown:
                blocks += taken[at:at + need]
                at += need
        return True

    def fits_each(self, reqs: Sequence[Hashable], num_tokens: Sequence[int]) -> bool:
        """Whether :meth:`allocate_each` of the same arguments would succeed (changes nothing)."""
        return self._growth(reqs, num_tokens)[1] <= self.num_free_blocks

    def _growth(self, reqs: Sequence[Hashable], num_tokens: Sequence[int]) -> tuple[list, int]:
        """(block table, new blocks) of each request that grows, and the new blocks in all."""
        tables, bs = self._req, self.block_size
        grown = []
        total = 0
        for req, tokens in zip(reqs, num_tokens):
            blocks = tables.get(req)
            if blocks is None:
                raise KVCacheError(f"allocate_each: request {req!r} holds no blocks")
            need = -(-tokens // bs) - len(blocks)
            if need > 0:
                grown.append((blocks, need))
                total += need
        return grown, total

    def free(self, req: Hashable, num_hashed: int = 0) -> None:
        """Release ``req``'s GPU blocks (tail blocks first to the free-queue tail), or its
        swap blocks if it is swapped out.

        With ``free_unhashed_first``, blocks that have no key go to the head instead: with
        prefix caching on, those past the first ``num_hashed`` that hold no key (a caller
        that registers keys lazily passes the full blocks it knows); with it off, all."""
        blocks = self._req.pop(req, None)
        if blocks is None:
            n = self._swapped.pop(req, None)
            if n is None:
                raise KVCacheError(f"free: request {req!r} holds no blocks (unknown or freed twice)")
            self._free_swap += n
            return
        self._release(blocks, num_hashed, self._ncached.pop(req))

    def _release(self, blocks: array, num_hashed: int, num_cached: int) -> None:
        """Give ``blocks`` back: those reaching ref 0 go to the free-queue tail, tail blocks
        first. ``num_cached``: how many leading ones hold keys (the rest, taken fresh and
        never registered, have this request as their only holder). With
        ``free_unhashed_first`` (newer vLLM), those without a key and past the first
        ``num_hashed`` go to the head instead, in order (the last of them becomes the head)."""
        if not blocks:
            return
        order = np.frombuffer(blocks, np.int64)
        if not self.enable_prefix_caching:   # no keys, no shared blocks
            if self.free_unhashed_first:
                self._front += blocks
            else:
                self._append(order[::-1])
            return
        # Blocks from `cut` on have no key and go to the head (free_unhashed_first): the
        # stack's last entry is the head, the first freed.
        cut = max(num_hashed, num_cached) if self.free_unhashed_first else order.shape[0]
        if cut < order.shape[0]:
            self._front += blocks[cut:]
            order = order[:cut]
        if num_cached:
            held = order[:num_cached]
            ref = self._ref
            if not self._nshared:   # no block has two holders: each held one reaches 0
                ref[held] = 0
            else:
                refs = ref[held]
                ref[held] = refs - 1
                last = refs == 1
                if not last.all():   # a few shared (a common prefix): they keep their other holders
                    self._nshared -= int(np.count_nonzero(refs == 2))
                    freed = np.ones(order.shape[0], bool)
                    freed[:num_cached] = last
                    order = order[freed]
        self._append(order[::-1])

    # -- swap (vLLM v0) ----------------------------------------------------------------

    def can_swap_out(self, req: Hashable) -> bool:
        blocks = self._req.get(req)
        return blocks is not None and len(blocks) <= self._free_swap

    def swap_out(self, req: Hashable) -> int:
        """Move ``req`` to swap space: release its GPU blocks, reserve as many swap blocks."""
        blocks = self._req.get(req)
        if blocks is None or len(blocks) > self._free_swap:
            raise KVCacheError(f"swap_out: request {req!r} cannot be swapped out "
                               f"(holds blocks: {blocks is not None}, free swap blocks: {self._free_swap})")
        del self._req[req]
        self._release(blocks, 0, self._ncached.pop(req))
        n = len(blocks)
        self._free_swap -= n
        self._swapped[req] = n
        return n

    def can_swap_in(self, req: Hashable, watermark_blocks: int = 0) -> bool:
        n = self._swapped.get(req)
        return n is not None and n + watermark_blocks <= self.num_free_blocks

    def swap_in(self, req: Hashable) -> int:
        """Bring ``req`` back: take as many fresh GPU blocks, release its swap blocks."""
        n = self._swapped.get(req)
        if n is None or n > self.num_free_blocks:
            raise KVCacheError(f"swap_in: request {req!r} cannot be swapped in "
                               f"(swapped: {n is not None}, free blocks: {self.num_free_blocks})")
        del self._swapped[req]
        self._free_swap += n
        blocks = array("q")
        self._take(n, blocks)
        self._req[req] = blocks
        self._ncached[req] = 0
        return n

    # -- introspection -----------------------------------------------------------------

    def _live(self) -> np.ndarray:
        """The queue's live entries from the head, in order (the stack at the head apart)."""
        entries = self._queue[self._head:self._tail]
        return entries[self._pos[entries] == self._index[self._head:self._tail]]

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next allocated) first."""
        return self._front[::-1] + self._live().tolist()

    def ref_count(self, block: int) -> int:
        return self._refs()[block]

    def _refs(self) -> list[int]:
        """Every block's ref count: kept for blocks with a key (only those can be shared),
        counted from the block tables for the others."""
        ref = np.where(self._keyed, self._ref, 0)
        for blocks in self._req.values():
            if blocks:
                held = np.frombuffer(blocks, np.int64)
                ref[held[~self._keyed[held]]] += 1
        return ref.tolist()

    def cached_key(self, block: int) -> Hashable | None:
        return self._key[block]

    def state(self) -> tuple:
        """A hashable snapshot of the whole state (tests: determinism, failure side effects)."""
        return (
            tuple(self.free_block_ids()), tuple(self._refs()), tuple(self._key.tolist()),
            tuple(self._cache.items()), tuple((k, tuple(v)) for k, v in self._dups.items()),
            tuple((r, tuple(b)) for r, b in self._req.items()), tuple(self._ncached.items()),
            tuple(self._swapped.items()), self._free_swap, self.hit_tokens, self.queried_tokens,
        )

    def check(self) -> None:
        """Check every invariant; raise :class:`KVCacheError` on the first broken one. O(blocks)."""
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise KVCacheError(f"check: {what}")

        n = self.num_blocks
        free = self.free_block_ids()
        need(len(set(free)) == len(free), "a block is in the free queue twice")
        need(self._nstale == self._tail - self._head - len(self._live()) >= 0,
             "stale free-queue entries miscounted")
        free = set(free)
        refs = self._refs()
        key = self._key.tolist()
        need(self._keyed.tolist() == [k is not None for k in key], "key flags and block keys disagree")
        need(0 not in free and refs[0] == 0 and key[0] is None,
             "null block 0 is free, held or cached")
        holders = [0] * n
        for req, blocks in self._req.items():
            blocks = blocks.tolist()
            need(len(set(blocks)) == len(blocks), f"request {req!r} holds a block twice: {blocks}")
            need(req not in self._swapped, f"request {req!r} is both on GPU and swapped")
            nc = self._ncached.get(req)
            need(nc is not None and 0 <= nc <= len(blocks), f"request {req!r} cached count {nc!r}")
            for i, b in enumerate(blocks):
                need(0 < b < n, f"request {req!r} holds invalid block {b}")
                holders[b] += 1
                if i < nc:
                    need(key[b] is not None, f"request {req!r} block {i} ({b}) counted cached, has no key")
                else:
                    need(key[b] is None, f"request {req!r} block {i} ({b}) past its cached ones has a key")
        need(self._ncached.keys() == self._req.keys(), "cached-count table out of step with requests")
        for b in range(1, n):
            need(refs[b] == holders[b], f"block {b}: ref {refs[b]} != holders {holders[b]}")
            need((b in free) == (holders[b] == 0), f"block {b}: free={b in free}, holders={holders[b]}")
        need(self._nshared == sum(1 for h in holders if h > 1), "shared-block count is off")
        need(len(free) + self.num_used_blocks == self.usable_blocks
             and self.num_used_blocks == sum(1 for h in holders if h), "block counts do not add up")
        # Cache: each keyed block is listed exactly once, under its own key.
        listed: dict[int, Hashable] = {}
        for k, b in self._cache.items():
            listed[b] = k
        for k, later in self._dups.items():
            need(bool(later) and k in self._cache, f"stale duplicate list for key {k!r}")
            for b in later:
                need(b not in listed, f"block {b} cached twice")
                listed[b] = k
        keyed = {b: key[b] for b in range(n) if key[b] is not None}
        need(listed == keyed, "cache map and block keys disagree")
        need(self.enable_prefix_caching or not keyed, "blocks cached with prefix caching off")
        need(self._free_swap + sum(self._swapped.values()) == self.num_swap_blocks
             and self._free_swap >= 0, "swap blocks do not add up")
        need(0 <= self.hit_tokens <= self.queried_tokens, "hit_tokens > queried_tokens")
