"""A FIFO of request rows in one preallocated numpy buffer (no per-request objects)."""

from __future__ import annotations

import numpy as np


class RowFifo:
    """Rows in arrival order; pushes at the tail, pops at the head, O(1) amortised."""

    def __init__(self, capacity: int):
        self._buf = np.empty(max(int(capacity), 1), dtype=np.int64)
        self._head = 0
        self._tail = 0

    def __len__(self) -> int:
        return self._tail - self._head

    def push_range(self, first: int, stop: int) -> None:
        self._make_room(stop - first)
        self._buf[self._tail:self._tail + stop - first] = np.arange(first, stop)
        self._tail += stop - first

    def push(self, rows: np.ndarray) -> None:
        self._make_room(len(rows))
        self._buf[self._tail:self._tail + len(rows)] = rows
        self._tail += len(rows)

    def peek(self, k: int) -> np.ndarray:
        """The first ``k`` rows (fewer if the queue is shorter); a view, do not keep it."""
        return self._buf[self._head:min(self._head + k, self._tail)]

    def head(self) -> int:
        return int(self._buf[self._head])

    def pop(self, k: int) -> np.ndarray:
        rows = self._buf[self._head:self._head + k].copy()
        self._head += k
        return rows

    def all(self) -> np.ndarray:
        return self._buf[self._head:self._tail]

    def remove(self, mask: np.ndarray) -> np.ndarray:
        """Drop the rows where ``mask`` (aligned with :meth:`all`) is true; return them."""
        rows = self.all()
        dropped = rows[mask].copy()
        kept = rows[~mask]
        self._buf[self._head:self._head + len(kept)] = kept
        self._tail = self._head + len(kept)
        return dropped

    def _make_room(self, k: int) -> None:
        if self._tail + k <= len(self._buf):
            return
        live = self._buf[self._head:self._tail]
        size = max(len(self._buf), 2 * (len(live) + k))
        buf = np.empty(size, dtype=np.int64)
        buf[:len(live)] = live
        self._buf, self._head, self._tail = buf, 0, len(live)
