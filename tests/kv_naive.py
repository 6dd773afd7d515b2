"""A naive model of the KV block manager's rules (plain lists, linear scans), for the
state-machine tests of policies/kv_cache.py."""

from __future__ import annotations


class NaiveKV:
    """Plain lists, linear scans: the rules read off vLLM directly."""

    def __init__(self, num_blocks, block_size, swap, *, caching=True, unhashed_first=False):
        self.caching, self.unhashed_first = caching, unhashed_first
        self.bs, self.usable = block_size, num_blocks - 1
        self.free = list(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.key = [None] * num_blocks
        self.cache = {}                         # key -> blocks, first cached first
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
        while self.caching and hits < min(len(keys), (n - 1) // self.bs) and self.lookup(keys[hits]) is not None:
            hits += 1
        return hits * self.bs

    def allocate(self, req, n, keys=(), cached=0, watermark=0):
        total = -(-n // self.bs)
        if req in self.reqs:
            need = max(total - len(self.reqs[req]), 0)
            if need and need + watermark > len(self.free):
                return None
            self.reqs[req] += self.take(need)
            return need
        hits = [self.lookup(k) for k in keys[:cached // self.bs]]
        need = total - len(hits)
        if need + sum(self.ref[b] == 0 for b in hits) + watermark > len(self.free):
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
            if self.key[b] is None:
                self.key[b] = keys[i]
                self.cache.setdefault(keys[i], []).append(b)
        self.ncached[req] = max(self.ncached[req], nfull)

    def release(self, blocks, num_hashed=0):
        """Blocks reaching ref 0, the last first, to the tail; with unhashed_first, those with
        no key past the first num_hashed (all with prefix caching off) to the head instead,
        the first freed at the head."""
        head = []
        for i in reversed(range(len(blocks))):
            b = blocks[i]
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.unhashed_first and not (self.caching and (i < num_hashed or self.key[b] is not None)):
                    head.append(b)
                else:
                    self.free.append(b)
        self.free[:0] = head

    def free_req(self, req, num_hashed=0):
        if req in self.swapped:
            self.swap_free += self.swapped.pop(req)
        else:
            del self.ncached[req]
            self.release(self.reqs.pop(req), num_hashed)

    def swap_out(self, req):
        blocks = self.reqs.pop(req)
        del self.ncached[req]
        self.release(blocks)
        self.swapped[req] = len(blocks)
        self.swap_free -= len(blocks)

    def swap_in(self, req):
        n = self.swapped.pop(req)
        self.swap_free += n
        self.reqs[req] = self.take(n)
        self.ncached[req] = 0
